"""Lifted scalars reach a directly called graph as Python numbers, not 0-d tensors.

Dynamo passes an unspecialized float to the compiled graph wrapped in a 0-d tensor: the
frame's bytecode calls ``torch._as_tensor_fullprec`` on it before every call (its
``GraphArg.pass_arg_as_tensor``), ~3 us a scalar, because the FX graph's input is a
tensor. A graph simaccel calls directly (no AOTAutograd runtime wrapper in between) reads
such an input only as a constant-bank value, and the bank takes the Python number as it
is. For those inputs the flag is cleared while the backend compiles: Dynamo generates the
bytecode that calls the graph after the backend returned, so the frame then passes the
number itself. Guards are unaffected (they check the source, a float, either way).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch.fx


def pass_scalars_unwrapped(gm: torch.fx.GraphModule, indices: Iterable[int]) -> list[int]:
    """Make the frame pass the Python scalars at graph input ``indices`` (Dynamo graph
    ``gm``'s placeholders) unwrapped where Dynamo would wrap them in a 0-d tensor;
    returns the indices changed. Only inputs whose callee accepts a Python number (a
    constant-bank input of a directly called graph) may be named."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    changed = []
    for index in sorted(indices):
        arg = placeholders[index].meta.get("grapharg") if index < len(placeholders) else None
        # not is_tensor: a Python scalar (a numpy array passed as a tensor has is_tensor)
        if arg is not None and arg.pass_arg_as_tensor and not arg.is_tensor \
                and getattr(arg.fake_tensor, "ndim", None) == 0:
            arg.pass_arg_as_tensor = False
            changed.append(index)
    return changed

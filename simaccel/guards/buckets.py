"""Static-shape hardware mode: every dynamic size lives in a bucket.

Real static-memory accelerators compile a program per shape bucket and plan memory for
the bucket's largest shape. With ``options={"shape_buckets": ...}`` simaccel does the same
with dynamic sizes: for each size symbol the frame's graph takes, the backend adds a guard
of its own (``simaccel.shape_bucket``: ``lo < size <= hi``), so a size in the same bucket
runs the same program with no recompile and one outside it compiles once for its bucket;
the program plans its memory for ``hi``. Kernels still loop over the real sizes (no
padding of user data).

Buckets: ``"pow2"`` (``(2**k, 2**(k+1)]``) or a sorted list of upper bounds
(``[16, 64, 256]``: ``(0, 16], (16, 64], (64, 256]``, then powers of two above).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from simaccel.guards import dynamo
from simaccel.guards.added import Guard, add_guard

BUCKET_GUARD = "simaccel.shape_bucket"


def bucket_of(value: int, buckets: Any) -> tuple[int, int]:
    """The bucket ``(lo, hi]`` holding ``value``."""
    bounds = [] if buckets == "pow2" else sorted(int(b) for b in buckets)
    lo = 0
    for hi in bounds:
        if value <= hi:
            return lo, hi
        lo = hi
    hi = max(lo, 1)
    while hi < value:
        lo, hi = hi, hi * 2
    return (lo, hi) if value > lo else (lo // 2, lo)


def bucket_guards(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                  buckets: Any) -> dict[str, int]:
    """Install a bucket guard on every size symbol the frame's graph takes as an input;
    returns each symbol's bucket upper bound (``{"s0": 64}``)."""
    uppers: dict[str, int] = {}
    for graph_input in dynamo.graph_inputs(gm):
        example = example_inputs[graph_input.index]
        if not isinstance(example, torch.SymInt) or graph_input.tensor_property is None:
            continue
        base, method, dim = graph_input.tensor_property
        if method != "size" or dim is None:
            continue
        lo, hi = bucket_of(dynamo.size_hint(example), buckets)
        added = add_guard(Guard(base, _in_bucket(dim, lo, hi), BUCKET_GUARD,
                                f"{lo} < {base}.size()[{dim}] <= {hi}"), added_by="simaccel")
        if added is not None:
            uppers[str(example)] = hi
    return uppers


def _in_bucket(dim: int, lo: int, hi: int):
    def check(t: torch.Tensor) -> bool:
        return lo < t.size(dim) <= hi
    return check

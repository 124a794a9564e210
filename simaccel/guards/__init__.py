"""Guards layer: lift baked-in Python scalars into graph inputs and report on guards.

Entry point for the backend (call it first in the CompilerFn, let its exception propagate)::

    report = lift_scalars(gm, example_inputs, lift=options.get("lift", "auto"),
                          keep=options.get("keep", ()))

How lifted scalars reach the graph (torch 2.13.0, any ``dynamic`` setting):

* ``float``  -> a placeholder whose ``meta["example_value"]`` is a 0-d ``torch.float64``
  FakeTensor; the matching ``example_inputs`` entry is a real 0-d float64 CPU tensor holding
  the traced value, and every call passes ``torch.as_tensor(value)``.  The graph reads it
  with ``.item()`` (a SymFloat); AOTAutograd's tensorify pass turns those uses back into
  tensor ops on the 0-d tensor.
* ``int``    -> a placeholder whose ``meta["example_value"]`` is a ``torch.SymInt``; the
  ``example_inputs`` entry is that SymInt too (``int(...)`` of it gives the traced value,
  also in ``LiftedScalar.value``), and every call passes the plain Python int.
* A scalar that only steers a branch is not a graph input at all: it is checked by a
  predicate guard (``L['alpha'] > 0.0``), so only a flip of the branch recompiles.
"""
from typing import Any

import torch

from simaccel.guards.dynamo import assert_supported_torch
from simaccel.guards.lift import keep_reason, lift_scalars
from simaccel.guards.policy import LiftPolicy, SourcePattern
from simaccel.guards.report import DroppedGuard, GuardReport, KeptGuard, LiftedScalar

__all__ = [
    "DroppedGuard", "GuardReport", "KeptGuard", "LiftPolicy", "LiftedScalar", "SourcePattern",
    "assert_supported_torch", "keep_reason", "lift_scalars", "prepare_frame",
]


def prepare_frame(gm: torch.fx.GraphModule, example_inputs: list[Any], opts: Any) -> GuardReport:
    """Adapter for ``simaccel.backend``: :func:`lift_scalars` with ``opts.lift``/``opts.keep``."""
    return lift_scalars(gm, example_inputs, lift=opts.lift, keep=opts.keep)

"""Guards layer: lift baked-in Python scalars into graph inputs and report on guards.

Entry point for the backend (call it first in the CompilerFn, let its exception propagate)::

    opts = simaccel.options.parse_options(options)  # validates lift/keep (the one place)
    report = lift_scalars(gm, example_inputs, lift=opts.lift, keep=opts.keep)

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

Backend-added guards (:mod:`simaccel.guards.added`): ``Guard(source, check, name)`` objects
from ``options={"guards": [...]}``, from backend passes (:func:`add_guard`) and simaccel's
device guards (:func:`device_guards`, which also returns the :class:`DevicePlanFacts`).
"""
import dataclasses
from typing import Any

import torch

from simaccel.guards.added import Guard, add_guard, add_user_guards, frame_added_guards
from simaccel.guards.device import DevicePlanFacts, device_guards
from simaccel.guards.dynamo import assert_supported_torch
from simaccel.guards.lift import lift_scalars
from simaccel.guards.policy import LiftPolicy, SourcePattern, keep_reason
from simaccel.guards.report import (
    AddedGuard, DroppedGuard, GuardReport, KeptGuard, LiftedScalar,
)

__all__ = [
    "AddedGuard", "DevicePlanFacts", "DroppedGuard", "Guard", "GuardReport", "KeptGuard",
    "LiftPolicy", "LiftedScalar", "SourcePattern", "add_guard", "add_user_guards",
    "assert_supported_torch", "device_guards", "frame_added_guards", "keep_reason",
    "lift_scalars", "prepare_frame",
]


def prepare_frame(gm: torch.fx.GraphModule, example_inputs: list[Any], opts: Any,
                  device: Any = None) -> GuardReport:
    """Adapter for ``simaccel.backend``: lift scalars, then add the frame's guards.

    :func:`lift_scalars` with ``opts.lift``/``opts.keep`` (may raise Dynamo's restart
    exception: let it propagate), then the user's ``opts.guards`` and, given ``device``,
    the device guards. The report's ``added`` lists them all (and guards added later in
    this frame compile); ``device_plan`` holds the :class:`DevicePlanFacts`.
    """
    report = lift_scalars(gm, example_inputs, lift=opts.lift, keep=opts.keep)
    add_user_guards(opts.guards)
    plan = device_guards(gm, example_inputs, device) if device is not None else None
    return dataclasses.replace(report, added=frame_added_guards(), device_plan=plan)

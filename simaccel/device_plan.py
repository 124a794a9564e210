"""Compile-time facts a compiled graph's DMA and constant-bank plans specialise on.

* A host tensor input whose data pointer is aligned to ``DeviceConfig.alignment`` is
  copied by one direct descriptor; a misaligned one goes through a staging buffer.
* A lifted int that fits 32 bits gets a 4-byte constant-bank slot, else 8 bytes.

The device guards compute and pin these facts (:func:`simaccel.guards.device_guards`), so a
change recompiles instead of running a plan made for other inputs; this module re-indexes
them for the graphs AOTAutograd produces.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from simaccel.guards.device import is_device_resident


@dataclass
class DevicePlan:
    """Facts by position in the frame's ``example_inputs``."""

    aligned: dict[int, bool] = field(default_factory=dict)
    int_dtypes: dict[int, str] = field(default_factory=dict)
    #: parameters and static-address inputs: kept resident on the device between calls
    resident: set[int] = field(default_factory=set)

    def shifted(self, offset: int) -> "DevicePlan":
        """The same facts for a graph whose inputs start ``offset`` positions later
        (AOTAutograd puts a module's own parameters first)."""
        return DevicePlan({i + offset: v for i, v in self.aligned.items()},
                          {i + offset: v for i, v in self.int_dtypes.items()},
                          {i + offset for i in self.resident})


def plan_from_guarded_facts(facts: Any, example_inputs: list[Any]) -> DevicePlan:
    """The plan the frame's device guards pin (``GuardReport.device_plan``): exactly what is
    guarded, so a call that would break it recompiles first. Parameters and static-address
    inputs become resident."""
    plan = DevicePlan()
    for index, fact in facts.inputs.items():
        if "aligned" in fact:
            plan.aligned[index] = bool(fact["aligned"])
        if "int_bits" in fact:
            plan.int_dtypes[index] = f"int{fact['int_bits']}"
    plan.resident = {i for i, v in enumerate(example_inputs) if is_device_resident(v)}
    return plan


def plan_for_graph(plan: DevicePlan, frame_gm: torch.fx.GraphModule, graph: torch.fx.GraphModule,
                   frame_inputs: int) -> DevicePlan | None:
    """``plan`` re-indexed for an AOTAutograd forward graph, or None when its inputs do not
    line up with the frame's (then the runtime decides per call)."""
    offset = sum(1 for _ in frame_gm.parameters()) + sum(1 for _ in frame_gm.buffers())
    placeholders = sum(1 for n in graph.graph.nodes if n.op == "placeholder")
    if placeholders != offset + frame_inputs:
        return None
    return plan.shifted(offset)

"""One decision per graph input: from the facts the frame's guards pin to the
:class:`~simaccel.runtime.spec.InputPlan` records a program is built from.

Facts (:class:`InputFacts`, by position in a graph's inputs) come from three places and
nowhere else:

* the frame's device guards (:class:`simaccel.guards.DevicePlanFacts`): alignment of
  host tensors, residency of parameters and static-address tensors, int slot widths;
* AOTAutograd's forward graph: the frame module's own parameters come first (resident);
* for a backward graph, what each input is in the forward graph
  (:func:`simaccel.guards.dynamo.backward_input_origins`): a forward input inherits its
  facts, a saved forward output is a host tensor simaccel allocated itself (aligned, its
  layout fixed at compile time), a tangent is checked per call.

:func:`plan_inputs` then decides each input's placement once (bank, resident, copied or
host-mapped) for the lowered graph. Adding a device-side input feature means: a field of
``InputPlan``, the line here that decides it, and the runtime step that uses it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from simaccel.codegen.dtypes import storage_dtype
from simaccel.codegen.graph import LoweredGraph
from simaccel.codegen.sizes import hint, is_value, same_size
from simaccel.guards import dynamo
from simaccel.runtime.hostmap import place_mapped_inputs, place_mapped_updates
from simaccel.runtime.spec import InputPlan, Placement

#: alignment (bytes) of every CPU tensor torch allocates (c10's ``gAlignment``): the host
#: outputs simaccel allocates are aligned to it.
HOST_ALLOCATION_ALIGNMENT = 64


@dataclass(frozen=True)
class InputFacts:
    """What compile time knows of one graph input. ``aligned``: pinned by a guard (None:
    not pinned, checked per call); ``int_bits``: constant-bank slot width of an int;
    ``requires_grad``: of a resident input (pinned by Dynamo's tensor guard); ``trained``:
    a resident parameter of a training graph (:func:`training_facts`)."""

    resident: bool = False
    aligned: bool | None = None
    int_bits: int = 64
    requires_grad: bool = False
    trained: bool = False


def frame_input_facts(device_facts: Any, count: int) -> list[InputFacts]:
    """Facts of the frame's ``count`` graph inputs from its device guards
    (:class:`simaccel.guards.DevicePlanFacts`; None: nothing pinned)."""
    facts = [InputFacts() for _ in range(count)]
    if device_facts is None:
        return facts
    for index, fact in device_facts.inputs.items():
        facts[index] = InputFacts(resident=bool(fact.get("resident", False)),
                                  aligned=fact.get("aligned"),
                                  int_bits=int(fact.get("int_bits", 64)),
                                  requires_grad=bool(fact.get("requires_grad", False)))
    return facts


def training_facts(facts: Sequence[InputFacts]) -> list[InputFacts]:
    """``facts`` of a training graph's forward (AOTAutograd compiles a backward for it):
    its resident inputs that require grad are parameters an optimizer updates between
    calls, so a device copy of one would be uploaded again at nearly every call (a
    training step: the forward's and the backward's copy of every weight). They are
    marked ``trained``: one kernel reading it reads it in host memory
    (:func:`~simaccel.runtime.hostmap.place_mapped_inputs`), which crosses the bus once
    per call, as the upload did, without the copy."""
    return [dataclasses.replace(f, trained=True) if f.resident and f.requires_grad else f
            for f in facts]


def forward_input_facts(frame: list[InputFacts], frame_gm: torch.fx.GraphModule,
                        forward: torch.fx.GraphModule) -> list[InputFacts]:
    """The frame's facts for an AOTAutograd forward graph: the frame module's own
    parameters and buffers (lifted first by AOTAutograd) are resident. Inputs that do not
    line up with the frame's get no pinned fact."""
    params = [InputFacts(resident=True, requires_grad=p.requires_grad)
              for p in frame_gm.parameters()]
    lifted = params + [InputFacts(resident=True) for _ in frame_gm.buffers()]
    count = _placeholder_count(forward)
    if count != len(lifted) + len(frame):
        return [InputFacts() for _ in range(count)]
    return lifted + list(frame)


def backward_input_facts(forward_facts: Sequence[InputFacts], forward: torch.fx.GraphModule,
                         backward: torch.fx.GraphModule, alignment: int) -> list[InputFacts]:
    """Facts of a backward graph's inputs, from what each is in the forward graph."""
    own_outputs_aligned = True if alignment <= HOST_ALLOCATION_ALIGNMENT else None
    facts = []
    for kind, position in dynamo.backward_input_origins(forward, backward):
        if kind == "forward_input" and position < len(forward_facts):
            facts.append(forward_facts[position])
        elif kind == "forward_output":
            facts.append(InputFacts(aligned=own_outputs_aligned))
        else:  # a tangent, or an input whose origin is unknown: nothing pinned
            facts.append(InputFacts())
    return facts


def bank_dtypes(facts: Sequence[InputFacts]) -> dict[int, str]:
    """Constant-bank slot dtype of each int input that fits 32 bits (by position)."""
    return {i: "int32" for i, fact in enumerate(facts) if fact.int_bits == 32}


def plan_inputs(lowered: LoweredGraph, facts: Sequence[InputFacts], example_inputs: list[Any],
                alignment: int, host_map_min_bytes: int, resident_writebacks: bool = False
                ) -> tuple[InputPlan, ...]:
    """The :class:`InputPlan` of every graph input of ``lowered`` (constants excluded),
    decided once: scalars go to the constant bank; resident facts stay resident unless
    the graph writes the input back out of place; every other tensor is copied, or
    host-mapped where :func:`place_mapped_inputs` allows; a resident input its one kernel
    updates in place is a mapped update (:func:`place_mapped_updates`): read and written
    in the caller's memory, never copied back; a ``trained`` one its one kernel reads is
    mapped (:func:`training_facts`). ``resident_writebacks``: the
    caller can tell the version an input written back will have at the next call
    (:class:`simaccel.compiled.CompiledGraph`)."""
    plans = []
    # an input written back from a buffer of its own changes on every call: keeping it
    # resident would upload it again each time, so it is copied like any input. One the
    # graph computes in place (:mod:`simaccel.codegen.inplace`) stays resident: its
    # device copy is the new value after the call.
    in_place = set(lowered.aliases.values()) if resident_writebacks else set()
    written = {index for index, _ in lowered.writebacks}
    for spec in lowered.inputs:
        if spec.index < 0:  # a graph constant (get_attr): uploaded once with the program
            continue
        fact = facts[spec.index] if spec.index < len(facts) else InputFacts()
        if spec.scalar:
            placement, aligned = Placement.BANK, None
        else:
            keeps = spec.index not in written or spec.buffer in in_place
            placement = Placement.RESIDENT if fact.resident and keeps else Placement.COPIED
            aligned = fact.aligned
        plans.append(InputPlan(spec.index, spec.buffer, placement,
                               storage_dtype(lowered.buffers[spec.buffer].dtype), aligned,
                               _c_contiguous(example_inputs[spec.index])))
    # the traced size decides a dynamic input (a heuristic threshold: no guard)
    nbytes = {p.buffer: hint(lowered.buffers[p.buffer].numel) * np.dtype(p.dtype).itemsize
              for p in plans}
    # a graph output computed in place is the input's buffer (the kernel stores there)
    outputs = [lowered.aliases.get(o.layout.buffer, o.layout.buffer) for o in lowered.outputs
               if hasattr(o, "layout")]
    # updates first: a small input read by a kernel updating a mapped input is mapped too
    updated = place_mapped_updates(plans, lowered.steps, outputs, in_place,
                                   host_map_min_bytes > 0)
    trained = {p.buffer for p in plans if p.placement is Placement.RESIDENT
               and p.index < len(facts) and facts[p.index].trained}
    return place_mapped_inputs(updated, lowered.steps, outputs, nbytes, host_map_min_bytes,
                               trained)


def _c_contiguous(value: Any) -> bool:
    """True for a tensor laid out in C order (strides of size-1 dims do not count, as for
    numpy's flag); Dynamo's tensor guard pins the strides. Over dynamic sizes it must hold
    for every size the graph serves: each stride is provably the product of the sizes
    after it (``same_size``: the shape env's knowledge, no guard added)."""
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return False
    shape, strides = tuple(value.shape), tuple(value.stride())
    if all(type(v) is int for v in (*shape, *strides)):
        return value.is_contiguous()
    expected: Any = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if is_value(size, 1):
            continue
        if not same_size(stride, expected):
            return False
        expected = expected * size
    return True


def _placeholder_count(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "placeholder")

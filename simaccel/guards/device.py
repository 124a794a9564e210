"""simaccel's own device guards: the facts a compiled graph's device plan specializes on.

For one Dynamo graph, :func:`device_guards` reads, per graph input (the positions of
``example_inputs``), the compile-time fact the runtime plan is built for, and guards it:

* tensor input: ``{"aligned": bool}``: its data pointer is a multiple of
  ``DeviceConfig.alignment`` (bytes), so one direct DMA descriptor can copy it; otherwise
  it goes through a staging buffer. Guard ``simaccel.aligned`` on the tensor.
* int input (a lifted Python int or a size symbol, a SymInt in the graph):
  ``{"int_bits": 32|64}``: the constant-bank slot it is fed to (32-bit when
  ``-2**31 <= v < 2**31``). Guard ``simaccel.int_slot`` on the value.
* the device config in force (``simaccel.configure``): memory plan, DMA plan and kernels
  are made for it. Guard ``simaccel.device_config`` on the frame.

An input whose fact cannot be guarded (no readable source: the 0-d tensor Dynamo makes
per call for a lifted float, or an intermediate value DDPOptimizer passes from one split
graph to the next) gets the fact that is correct for any value: alignment not pinned
(``{"aligned": None}``: the program checks it per call) and 64 bits.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from simaccel.errors import InvalidOptionError
from simaccel.guards import dynamo
from simaccel.guards.added import (
    Guard, add_frame_expression, add_guard, add_source_expression, record_shape_env_guard,
)
from simaccel.guards.records import GraphInput
from simaccel.guards.report import AddedGuard

log = logging.getLogger("simaccel")

INT_SLOT = "simaccel.int_slot"
ALIGNED = "simaccel.aligned"
DEVICE_CONFIG = "simaccel.device_config"
INT32_MIN = -(2 ** 31)
INT32_END = 2 ** 31  # exclusive


@dataclass(frozen=True)
class DevicePlanFacts:
    """Compile-time facts of one Dynamo graph that its device plan is built on.

    ``inputs`` maps an ``example_inputs`` index to ``{"aligned": bool | None}`` (tensor
    inputs; None: not pinned, checked per call),
    ``{"resident": True, "requires_grad": bool}`` (parameters and static-address
    tensors: no per-call guard, their alignment is checked at each upload; Dynamo's
    tensor guard pins ``requires_grad``) or ``{"int_bits": 32 | 64}`` (int inputs); other
    inputs are absent. ``alignment`` (bytes)
    and ``config_key`` are those of the device config in force at compile time. ``guards``
    are the device guards installed for these facts.
    """

    alignment: int
    config_key: tuple
    inputs: Mapping[int, Mapping[str, Any]]
    guards: tuple[AddedGuard, ...] = ()

    def __getitem__(self, index: int) -> Mapping[str, Any]:
        return self.inputs[index]

    def aligned(self, index: int) -> bool:
        """Whether tensor input ``index`` takes the direct DMA path (False if not a tensor)."""
        return bool(self.inputs.get(index, {}).get("aligned", False))

    def int_bits(self, index: int) -> int:
        """Constant-bank slot width (bits) of int input ``index`` (64 if not an int input)."""
        return int(self.inputs.get(index, {}).get("int_bits", 64))

    def __str__(self) -> str:
        parts = [f"{i}: " + ", ".join(f"{k}={v}" for k, v in fact.items())
                 for i, fact in sorted(self.inputs.items())]
        return f"alignment {self.alignment} bytes; inputs {{{'; '.join(parts)}}}"


def is_device_resident(value: Any) -> bool:
    """True for inputs kept on the device between calls, uploaded again only when their
    contents change: module state (:func:`simaccel.guards.dynamo.is_module_state`:
    parameters, and tensors marked with ``torch._dynamo.mark_static_address``)."""
    return dynamo.is_module_state(value)


def fits_int32(value: int) -> bool:
    """True if ``value`` fits a signed 32-bit constant-bank slot."""
    return INT32_MIN <= value < INT32_END


def device_guards(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                  device: Any) -> DevicePlanFacts:
    """Install simaccel's device guards on the frame being compiled; return the facts.

    ``device`` is the simulated device (``simaccel.get_device()``): anything with a
    ``config`` carrying ``alignment`` (bytes) and ``key()``. Call it inside the CompilerFn,
    after :func:`simaccel.guards.lift_scalars` returned (a re-trace drops earlier guards).
    """
    config = device.config
    alignment = int(config.alignment)
    added = [_config_guard(device)]
    inputs: dict[int, dict[str, Any]] = {}
    for graph_input in dynamo.graph_inputs(gm):
        example = example_inputs[graph_input.index]
        if isinstance(example, torch.Tensor):
            fact, guard = _tensor_fact(graph_input, alignment)
        elif isinstance(example, (int, torch.SymInt)) and not isinstance(example, bool):
            fact, guard = _int_fact(graph_input, example)
        else:
            continue
        if isinstance(guard, AddedGuard):
            added.append(guard)
        elif guard is not None and not _try_add(guard, added):
            fact = {"aligned": None} if "aligned" in fact else {"int_bits": 64}
        inputs[graph_input.index] = fact
    return DevicePlanFacts(alignment, config.key(), inputs, tuple(added))


def _config_guard(device: Any) -> AddedGuard:
    config = device.config
    # An expression, not a check function: it runs inline in the frame's folded guard
    # check. Same object, or an equal config (simaccel.configure restores a copy).
    return add_frame_expression(
        DEVICE_CONFIG, "{device}.config is {config} or {device}.config.key() == {key}",
        {"device": device, "config": config, "key": config.key()},
        f"simaccel.get_device().config.key() == {config!r}.key()")


def _tensor_fact(graph_input: GraphInput,
                 alignment: int) -> tuple[dict[str, Any], Guard | None]:
    value = graph_input.value
    if graph_input.source is None or not isinstance(value, torch.Tensor):
        # a tensor made per call (no source): no pointer to pin, checked per call
        return {"aligned": None}, None
    if is_device_resident(value):
        # Resident on the device (uploaded once, again when its version moves): its
        # alignment matters only at an upload, which checks it then. No per-call guard, so
        # a model's parameters cost nothing on every call.
        return {"resident": True, "requires_grad": bool(value.requires_grad)}, None
    expr = f"{graph_input.source}.data_ptr() % {alignment} == 0"
    # Inline in the frame's folded check where the source is a plain Python expression
    # (~150 ns less per call than a lambda guard on the tensor).
    record = add_source_expression(ALIGNED, graph_input.source, expr)
    if record is not None:
        return {"aligned": record.compiled_result}, record

    def is_aligned(t: torch.Tensor) -> bool:
        return t.data_ptr() % alignment == 0

    return {"aligned": is_aligned(value)}, Guard(graph_input.source, is_aligned, ALIGNED, expr)


def _int_fact(graph_input: GraphInput,
              example: Any) -> tuple[dict[str, Any], Guard | AddedGuard | None]:
    value = graph_input.value
    if graph_input.source is not None and graph_input.tensor_property is None:
        # A lifted int is a SymInt. Its slot guard is a Python expression in the frame's
        # folded check (~30 ns per call) where its source is a plain chain: a shape-env
        # guard costs as little per call, but its sympy relation is often the compile's
        # first sympy sum, which imports sympy.tensor (~50 ms of a first compile).
        text = f"{INT32_MIN} <= {graph_input.source} < {INT32_END}"
        if isinstance(example, torch.SymInt):
            record = add_source_expression(INT_SLOT, graph_input.source, text)
            if record is not None:
                return {"int_bits": 32 if record.compiled_result else 64}, record
        # Otherwise it joins Dynamo's shape-env guards, which run in the same folded
        # check (dynamo.SIMACCEL_SHAPE_ENV), listed in the report as a shape-env guard.
        fits = dynamo.guard_symint_range(example, INT32_MIN, INT32_END, INT_SLOT)
        if fits is not None:
            return {"int_bits": 32 if fits else 64}, record_shape_env_guard(
                INT_SLOT, graph_input.source, text if fits else f"not ({text})", fits)
    if not isinstance(value, int) or graph_input.source is None:
        # int() of a SymInt would add a shape guard (specializing it): use its hint.
        hint = dynamo.size_hint(example)
        return {"int_bits": 32 if isinstance(hint, int) and fits_int32(hint) else 64}, None
    fact = {"int_bits": 32 if fits_int32(value) else 64}
    text = f"{INT32_MIN} <= {graph_input.source} < {INT32_END}"
    if graph_input.tensor_property is None:
        return fact, Guard(graph_input.source, fits_int32, INT_SLOT, text)
    base, method, dim = graph_input.tensor_property
    args = () if dim is None else (dim,)

    def property_fits(t: torch.Tensor) -> bool:
        return fits_int32(getattr(t, method)(*args))

    return fact, Guard(base, property_fits, INT_SLOT, text)


def _try_add(guard: Guard, added: list[AddedGuard]) -> bool:
    """Install a device guard; a source Dynamo cannot guard keeps the safe fact instead."""
    try:
        added.append(add_guard(guard, added_by="simaccel"))
    except InvalidOptionError as err:
        log.debug("simaccel: no %s guard on %s (%s); using the safe plan", guard.name,
                  guard.source, err)
        return False
    return True

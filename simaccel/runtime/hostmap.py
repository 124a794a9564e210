"""Host-mapped ("zero-copy") inputs: which per-call inputs a kernel reads in place.

A real accelerator can map pinned host memory into its address space (CUDA mapped pinned
memory, unified memory on integrated parts): a kernel then reads the buffer across the
bus instead of the runtime copying it into device memory first. That pays off for a large
input read once, by one kernel; an input read several times would cross the bus each
time. The decision is taken once, at compile time, from the program's structure and the
inputs' pinned facts (this module knows nothing of torch).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from simaccel.errors import SimAccelError
from simaccel.runtime.spec import InputPlan, Placement, Step


def place_mapped_inputs(inputs: Sequence[InputPlan], steps: Sequence[Any],
                        output_buffers: Iterable[str], nbytes: Mapping[str, int],
                        min_bytes: int) -> tuple[InputPlan, ...]:
    """``inputs`` with every copied input a kernel can read in place turned into a mapped
    one (the decision, taken once at compile time).

    ``steps``: the program's steps in order, anything with ``reads``, ``writes`` and
    ``on_device`` (kernel IR or runtime steps); ``output_buffers``: buffers read back after
    the call; ``nbytes``: buffer sizes (bytes); ``min_bytes``:
    ``DeviceConfig.host_map_min_bytes`` (0 maps nothing). A copied input qualifies when it
    is at least ``min_bytes`` large, C-contiguous on the host, pinned aligned (a direct
    DMA), read by exactly one kernel and by no host step, written by no step and not itself
    a graph output (its device copy would be read back after the call)."""
    if min_bytes <= 0:
        return tuple(inputs)
    readers, untouchable = _kernel_readers(steps)
    untouchable |= set(output_buffers)

    def qualifies(plan: InputPlan) -> bool:
        return (plan.placement is Placement.COPIED and plan.aligned is True
                and plan.contiguous and nbytes[plan.buffer] >= min_bytes
                and readers.get(plan.buffer) == 1 and plan.buffer not in untouchable)

    return tuple(dataclasses.replace(p, placement=Placement.MAPPED) if qualifies(p) else p
                 for p in inputs)


def _kernel_readers(steps: Sequence[Any]) -> tuple[dict[str, int], set[str]]:
    """(buffer -> number of kernels reading it, buffers no kernel may read in place:
    those a host step touches or any step writes)."""
    readers: dict[str, int] = {}
    untouchable: set[str] = set()
    for step in steps:
        untouchable.update(step.writes)
        if not step.on_device:
            untouchable.update(step.reads)
            continue
        for name in step.reads:
            readers[name] = readers.get(name, 0) + 1
    return readers, untouchable


def mapped_steps(steps: Sequence[Step], streamed: Sequence[InputPlan]
                 ) -> list[tuple[int, list[int]]]:
    """(step index, positions in ``streamed`` of the mapped inputs it reads) of every
    kernel that reads a host-mapped input: those launches are bound to the host arrays."""
    position = {p.buffer: k for k, p in enumerate(streamed) if p.placement is Placement.MAPPED}
    found = []
    for k, step in enumerate(steps):
        reads = sorted({position[b] for b in step.reads if b in position})
        if reads:
            found.append((k, reads))
    return found


def check_mapped(index: int, name: str, host: np.ndarray, dtype: np.dtype, numel: int) -> None:
    """Raise unless ``host`` is what the kernel was compiled to read in place: a C-contiguous
    ``dtype`` array of ``numel`` elements. Dynamo's tensor guard pins dtype, shape and
    strides, so a violation means a guard failed to recompile (never copy silently)."""
    if host.flags.c_contiguous and host.dtype == dtype and host.size == numel:
        return
    raise SimAccelError(
        f"input {index} ({name}) is host-mapped and must be a C-contiguous {dtype} array of "
        f"{numel} elements, got {host.dtype} shape {host.shape} strides {host.strides}; "
        f"Dynamo's tensor guard should have recompiled this graph (please report this)")

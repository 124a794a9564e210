"""Host-mapped ("zero-copy") inputs: which per-call inputs a kernel reads in place.

A real accelerator can map pinned host memory into its address space (CUDA mapped pinned
memory, unified memory on integrated parts): a kernel then reads the buffer across the
bus instead of the runtime copying it into device memory first. That pays off for a large
input read once, by one kernel; an input read several times would cross the bus each
time. The decision is taken once per program and device config, from the program's
structure alone (this module knows nothing of torch).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simaccel.errors import SimAccelError

if TYPE_CHECKING:  # program.py imports this module
    from simaccel.runtime.program import ProgramSpec


def host_mapped_inputs(spec: "ProgramSpec", streamed: list[tuple[int, str]],
                       min_bytes: int) -> dict[int, str]:
    """The per-call inputs (argument index -> buffer) a kernel reads in place.

    ``streamed``: the (argument index, buffer) inputs copied in on every call (not
    resident); ``min_bytes``: ``DeviceConfig.host_map_min_bytes`` (bytes; 0 maps nothing).
    An input qualifies when it is at least ``min_bytes`` large, C-contiguous on the host,
    planned for a direct (aligned) DMA, read by exactly one kernel and by no host fallback,
    written by no step and not itself a graph output (its device copy would be read back
    after the call)."""
    if min_bytes <= 0:
        return {}
    readers, untouchable = _kernel_readers(spec)
    untouchable |= {out.buffer for out in spec.outputs if out is not None}
    return {index: name for index, name in streamed
            if spec.buffers[name].nbytes >= min_bytes
            and spec.aligned_inputs.get(index) is True and index in spec.contiguous_inputs
            and readers.get(name) == 1 and name not in untouchable}


def _kernel_readers(spec: "ProgramSpec") -> tuple[dict[str, int], set[str]]:
    """(buffer -> number of kernels launched on it, buffers no kernel may read in place:
    those a host step touches or any step may write)."""
    from simaccel.runtime.program import LaunchStep  # program.py imports this module

    readers: dict[str, int] = {}
    untouchable: set[str] = set()
    for step in spec.steps:
        if not isinstance(step, LaunchStep):
            untouchable.update(step.reads, step.writes)
            continue
        for name in set(step.buffers):
            readers[name] = readers.get(name, 0) + 1
        untouchable.update(step.buffers if step.writes is None else step.writes)
    return readers, untouchable


def mapped_steps(spec: "ProgramSpec", streamed: list[tuple[int, str]],
                 mapped: dict[int, str]) -> list[tuple[int, list[int]]]:
    """(step index, positions in ``streamed`` of the mapped inputs it reads) of every
    kernel that reads a host-mapped input: those launches are bound to the host arrays."""
    position = {name: k for k, (index, name) in enumerate(streamed) if index in mapped}
    steps = []
    for k, step in enumerate(spec.steps):
        reads = sorted({position[b] for b in getattr(step, "buffers", ()) if b in position})
        if reads:
            steps.append((k, reads))
    return steps


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

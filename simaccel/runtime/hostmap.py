"""Host-mapped ("zero-copy") inputs: which inputs a kernel reads, or updates, in place.

A real accelerator can map pinned host memory into its address space (CUDA mapped pinned
memory, unified memory on integrated parts): a kernel then reads the buffer across the
bus instead of the runtime copying it into device memory first. That pays off for a large
input read once, by one kernel; an input read several times would cross the bus each
time. The decision is taken once, at compile time, from the program's structure and the
inputs' pinned facts (this module knows nothing of torch).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
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


def place_mapped_updates(inputs: Sequence[InputPlan], steps: Sequence[Any],
                         output_buffers: Iterable[str], in_place: Iterable[str],
                         enabled: bool) -> tuple[InputPlan, ...]:
    """``inputs`` with every resident input its one kernel updates in place turned into a
    mapped update: the kernel reads and writes the caller's memory across the bus (the
    decision, taken once at compile time; ``enabled``: host mapping is on).

    A resident input the graph updates in place (``in_place``: buffers the kernel computing
    an input mutation stores into, :mod:`simaccel.codegen.inplace`) otherwise stays on
    the device and is copied back to the caller after every call: an optimizer step reads
    and writes each parameter and state tensor once, so the copy back costs as much bus
    time as the kernel's own access would, and a host copy on every call. Mapped, the
    kernel's one read and one write cross the bus (timed and counted as an h2d read and a
    d2h write) and nothing is copied. It qualifies when one step touches the buffer, a
    kernel, and it is no graph output besides its write-back (``output_buffers``) and
    C-contiguous. Alignment does not matter: the kernel addresses its elements itself, no
    DMA descriptor does. Its static address keeps the kernel bound to the same host array
    call after call."""
    if not enabled:
        return tuple(inputs)
    touching: dict[str, int] = {}
    untouchable = set(output_buffers)
    for step in steps:
        for name in {*step.reads, *step.writes}:
            touching[name] = touching.get(name, 0) + 1
            if not step.on_device:
                untouchable.add(name)
    updated = set(in_place)

    def qualifies(plan: InputPlan) -> bool:
        return (plan.placement is Placement.RESIDENT and plan.buffer in updated
                and plan.contiguous and touching.get(plan.buffer) == 1 and plan.buffer not in untouchable)

    return tuple(dataclasses.replace(p, placement=Placement.MAPPED_UPDATE) if qualifies(p)
                 else p for p in inputs)


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
    position = {p.buffer: k for k, p in enumerate(streamed) if p.placement in MAPPED}
    found = []
    for k, step in enumerate(steps):
        reads = sorted({position[b] for b in step.reads if b in position})
        if reads:
            found.append((k, reads))
    return found


def check_mapped(index: int, name: str, host: np.ndarray, dtype: np.dtype, numel: int,
                 written: bool = False) -> None:
    """Raise unless ``host`` is what the kernel was compiled to read (and, ``written``, to
    write) in place: a C-contiguous ``dtype`` array of ``numel`` elements, writeable if
    written. Dynamo's tensor guard pins dtype, shape and strides, so a violation means a
    guard failed to recompile (never copy silently)."""
    if host.flags.c_contiguous and host.dtype == dtype and host.size == numel and (
            host.flags.writeable or not written):
        return
    raise SimAccelError(
        f"input {index} ({name}) is host-mapped and must be a C-contiguous"
        f"{' writeable' if written else ''} {dtype} array of {numel} elements, got "
        f"{host.dtype} shape {host.shape} strides {host.strides}"
        f"{'' if host.flags.writeable else ' (read-only)'}; Dynamo's tensor guard should "
        f"have recompiled this graph (please report this)")


#: the placements a kernel accesses in host memory
MAPPED = frozenset({Placement.MAPPED, Placement.MAPPED_UPDATE})


def bind_mapped(bound: Any, srcs: Sequence[np.ndarray], data_ptrs: Sequence[int] | None,
                streamed: Sequence[InputPlan], steps: Sequence[tuple[int, list[int]]],
                bind: Callable[[int, dict[str, np.ndarray]], None]) -> None:
    """Bind each launch that reads or updates a host-mapped input to this call's host
    arrays (``srcs``: the program's ``streamed`` inputs; ``steps``: :func:`mapped_steps`;
    ``bind(k, hosts)`` binds step ``k`` to ``hosts``, buffer -> flat host array), unless it
    is bound to the same addresses already (a caller passing the same tensor every call
    binds nothing after the first). ``bound``: the workspace's
    :class:`~simaccel.runtime.resident.BoundWorkspace`; its bound launches keep their arrays
    alive, so an address seen again is the same live memory. Each new host array is
    checked against the compiled layout; the very arrays of the last call (a parameter's
    kept view) need no check again (a numpy array keeps its layout)."""
    numel = bound.layout.numel
    for k, positions in steps:
        last = bound.mapped_arrays.get(k)
        if last is not None and all(srcs[p] is a for p, a in zip(positions, last)):
            continue
        for p in positions:
            plan = streamed[p]
            check_mapped(plan.index, plan.buffer, srcs[p], np.dtype(plan.dtype),
                         numel[plan.buffer], plan.placement is Placement.MAPPED_UPDATE)
        bound.mapped_arrays[k] = [srcs[p] for p in positions]
        key = tuple(data_ptr(streamed[p].index, srcs[p], data_ptrs) for p in positions)
        if bound.mapped_keys.get(k) != key:
            # kernels take flat arrays: a view of the (checked C-contiguous) host array
            bind(k, {streamed[p].buffer: srcs[p].reshape(-1) for p in positions})
            bound.mapped_keys[k] = key


def data_ptr(index: int, host: np.ndarray, data_ptrs: Sequence[int] | None) -> int:
    """Address of argument ``index``'s first element (bytes): the caller's, when it passed
    it (cheap for torch tensors; 0 where it did not know one), else numpy's."""
    known = data_ptrs[index] if data_ptrs is not None else 0
    return known or host.__array_interface__["data"][0]


def unbound_mapped_launch() -> None:
    """The launch slot of a kernel reading a host-mapped input until :func:`bind_mapped`
    binds it to a call's host arrays."""
    raise SimAccelError("a kernel reading a host-mapped input was launched before it was "
                        "bound to the host arrays (please report this)")

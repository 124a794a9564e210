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
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simaccel.errors import SimAccelError
from simaccel.runtime.spec import InputPlan, OutputDecl, Placement, Step


def place_mapped_inputs(inputs: Sequence[InputPlan], steps: Sequence[Any],
                        output_buffers: Iterable[str], nbytes: Mapping[str, int],
                        min_bytes: int, trained: Iterable[str] = ()) -> tuple[InputPlan, ...]:
    """``inputs`` with every copied input a kernel can read in place turned into a mapped
    one (the decision, taken once at compile time).

    ``steps``: the program's steps in order, anything with ``reads``, ``writes`` and
    ``on_device`` (kernel IR or runtime steps); ``output_buffers``: buffers read back after
    the call; ``nbytes``: buffer sizes (bytes); ``min_bytes``:
    ``DeviceConfig.host_map_min_bytes`` (0 maps nothing). A copied input qualifies when it
    is C-contiguous on the host, pinned aligned (a direct DMA), read by exactly one kernel
    and by no host step (or by several library GEMMs that read disjoint parts of it:
    :func:`_read_apart`, each element still crosses the bus once), written by no step and
    not itself a graph output (its device
    copy would be read back after the call), and either at least ``min_bytes`` large or
    read by a kernel that updates a mapped input (``inputs`` placed
    :attr:`~Placement.MAPPED_UPDATE`, :func:`place_mapped_updates` first): that kernel
    runs across the bus anyway, so a small input it reads there too saves its copy (an
    optimizer step's gradient beside the parameter and state it updates).

    ``trained``: resident inputs that change between nearly all calls (a training graph's
    parameters): their device copy would be uploaded again each call, so one read as
    above is mapped at any size and alignment (a kept view: the launch stays bound to
    it; no descriptor moves a mapped input, so its address needs no alignment)."""
    if min_bytes <= 0:
        return tuple(inputs)
    trained = set(trained)
    readers, untouchable = _kernel_readers(steps)
    untouchable |= set(output_buffers)
    over_bus = _reads_of_bus_kernels(steps, {p.buffer for p in inputs
                                             if p.placement is Placement.MAPPED_UPDATE})

    def worth_it(plan: InputPlan) -> bool:
        if plan.placement is Placement.RESIDENT:
            return plan.buffer in trained
        return (plan.placement is Placement.COPIED and plan.aligned is True
                and (nbytes[plan.buffer] >= min_bytes or plan.buffer in over_bus))

    def qualifies(plan: InputPlan) -> bool:
        return (worth_it(plan) and plan.contiguous
                and (readers.get(plan.buffer) == 1 or _read_apart(plan.buffer, steps))
                and plan.buffer not in untouchable)

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


def place_mapped_outputs(outputs: Sequence[OutputDecl | None], steps: Sequence[Any],
                         inputs: Sequence[InputPlan], numel: Mapping[str, Any],
                         itemsize: Mapping[str, int], host_contiguous: Sequence[bool],
                         min_bytes: int, first_writeback: int,
                         library_written: Iterable[str] = ()) -> tuple[OutputDecl | None, ...]:
    """``outputs`` with every output the kernel computing it can write into the
    caller's host array in place marked mapped (the decision, taken once at compile
    time): the mirror of :func:`place_mapped_inputs`. A kernel writing a large result
    once across the bus costs what the copy back would, and the copy is gone (measured:
    25-80 us per MB on this machine), as is the buffer's device memory.

    ``steps``: the program's steps (``reads``, ``writes``, ``on_device``); ``numel`` and
    ``itemsize``: each buffer's elements (a static int, else not mapped) and bytes per
    element; ``host_contiguous``: per output, the host array the caller allocates is
    C-contiguous; ``min_bytes``: ``DeviceConfig.host_map_min_bytes`` (0 maps nothing);
    outputs from ``first_writeback`` on are input write-backs (never mapped: they go into
    the caller's own tensor). An output qualifies when it is at least ``min_bytes``
    large, the whole of its buffer in C order (offset 0, contiguous strides, static
    sizes), on both sides, and its buffer is written by exactly one step, a compiled
    kernel, read by no step, no input's and no other output's.

    Not a library call's (``library_written``): such an op computes into a tensor of its
    own and copies it out anyway, so mapping only moves that copy while the call rebinds
    its tensor views every call (measured on causal attention, 1 MB out: ~5% slower
    than copying back). A library GEMM writes its product in place and its launch takes
    a new output array by a patch, so the compiler leaves it out of that set (a training
    backward's weight gradients), as it leaves out a library call's output of several MB
    (``LIBRARY_MAPPED_MIN_BYTES``), where the copy saved outweighs the rebinding."""
    if min_bytes <= 0:
        return tuple(outputs)
    library = set(library_written)
    writers: dict[str, list[Any]] = {}
    read: set[str] = set()
    for step in steps:
        read.update(step.reads)
        for name in step.writes:
            writers.setdefault(name, []).append(step)
    taken = {p.buffer for p in inputs}
    counts: dict[str, int] = {}
    for out in outputs:
        if out is not None:
            counts[out.buffer] = counts.get(out.buffer, 0) + 1

    def qualifies(k: int, out: OutputDecl) -> bool:
        found = writers.get(out.buffer, [])
        n = numel[out.buffer]
        return (k < first_writeback and host_contiguous[k] and isinstance(n, int)
                and n * itemsize[out.buffer] >= min_bytes and _whole_buffer(out, n)
                and len(found) == 1 and found[0].on_device and out.buffer not in read
                and out.buffer not in library
                and out.buffer not in taken and counts[out.buffer] == 1)

    return tuple(dataclasses.replace(out, mapped=True) if out is not None and qualifies(k, out)
                 else out for k, out in enumerate(outputs))


def _whole_buffer(out: OutputDecl, numel: int) -> bool:
    """True if ``out`` views all ``numel`` elements of its buffer in C order."""
    if not all(isinstance(v, int) for v in (*out.shape, *out.strides, out.offset)):
        return False
    return out.offset == 0 and int(np.prod(out.shape)) == numel \
        and c_order(out.shape, out.strides)


def c_order(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """True if ``strides`` (elements) lay ``shape`` out in C order (a size-1 dim's stride
    does not matter, as for numpy's flag)."""
    expected = 1
    for n, stride in zip(reversed(shape), reversed(strides)):
        if n != 1 and stride != expected:
            return False
        expected *= n
    return True


def _reads_of_bus_kernels(steps: Sequence[Any], updated: set[str]) -> set[str]:
    """Buffers read by a kernel that also updates one of ``updated`` (mapped updates)."""
    found: set[str] = set()
    for step in steps:
        if step.on_device and updated.intersection(step.writes):
            found.update(step.reads)
    return found


def _read_apart(buffer: str, steps: Sequence[Any]) -> bool:
    """True if every kernel reading ``buffer`` tells which of its elements it reads (a
    library GEMM's ``operand_spans``) and no element is read twice: causal attention's
    key and value halves, each read by its own GEMM."""
    spans: list[tuple[int, int]] = []
    for step in steps:
        if buffer not in step.reads:
            continue
        describe = getattr(getattr(step, "fn", None), "operand_spans", None)
        found = describe(tuple(step.params)) if describe is not None else None
        if found is None:
            return False
        positions = [i for i, name in enumerate(step.buffers) if name == buffer]
        if not all(i in found for i in positions):
            return False
        spans += [span for i in positions for span in found[i]]
    spans.sort()
    return bool(spans) and all(stop <= start for (_, stop), (start, _) in
                               zip(spans, spans[1:]))


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


@dataclass(frozen=True)
class HostBoundStep:
    """A kernel that accesses host memory, so its launch is bound to each call's host
    arrays: step ``index``; ``inputs``: positions in the program's streamed inputs of the
    mapped inputs it reads or updates; ``outputs``: (output position, buffer) of the
    mapped outputs it writes; ``arguments``: buffer -> its positions among the step's
    arguments (what :func:`bind_mapped` patches in a launch bound before)."""

    index: int
    inputs: tuple[int, ...]
    outputs: tuple[tuple[int, str], ...] = ()
    arguments: Mapping[str, tuple[int, ...]] = dataclasses.field(
        default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class MappedLaunches:
    """The kernels of a program that access host memory (:func:`mapped_steps`), in step
    order, and what binding them each call needs: ``positions``, the streamed positions of
    the mapped inputs they read; ``writing``, those writing a mapped output (bound again
    every call: each call's output arrays are new)."""

    steps: tuple[HostBoundStep, ...]
    positions: tuple[int, ...]
    writing: tuple[HostBoundStep, ...]
    #: the argument index of each of ``positions`` (where the caller's data addresses are)
    indices: tuple[int, ...] = ()
    #: the streamed positions of every mapped input, in order (what a binding is to)
    sources: tuple[int, ...] = ()

    def __iter__(self) -> Any:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)


def mapped_steps(steps: Sequence[Step], streamed: Sequence[InputPlan],
                 outputs: Sequence[OutputDecl | None] = ()) -> MappedLaunches:
    """Every kernel that reads (or updates) a host-mapped input or writes a host-mapped
    output: those launches are bound to the host arrays."""
    position = {p.buffer: k for k, p in enumerate(streamed) if p.placement in MAPPED}
    written = {out.buffer: k for k, out in enumerate(outputs) if out is not None and out.mapped}
    found = []
    for k, step in enumerate(steps):
        reads = tuple(sorted({position[b] for b in step.reads if b in position}))
        writes = tuple(sorted((written[b], b) for b in step.writes if b in written))
        if reads or writes:
            arguments: dict[str, tuple[int, ...]] = {}
            for j, name in enumerate(getattr(step, "buffers", ())):
                arguments[name] = (*arguments.get(name, ()), j)
            found.append(HostBoundStep(k, reads, writes, arguments))
    positions = tuple(sorted({p for s in found for p in s.inputs}))
    return MappedLaunches(tuple(found), positions, tuple(s for s in found if s.outputs),
                          tuple(streamed[p].index for p in positions),
                          tuple(k for k, p in enumerate(streamed) if p.placement in MAPPED))


def check_mapped(kind: str, position: int, name: str, host: np.ndarray, dtype: np.dtype,
                 numel: int, written: bool = False) -> None:
    """Raise unless ``host`` is what the kernel was compiled to read (and, ``written``, to
    write) in place: a C-contiguous ``dtype`` array of ``numel`` elements, writeable if
    written. ``kind`` and ``position``: "input" 3, "output" 0. Dynamo's tensor guard pins
    an input's dtype, shape and strides, and simaccel allocates the outputs, so a
    violation means a guard failed to recompile or a caller passed the program other
    arrays (never copy silently)."""
    if host.flags.c_contiguous and host.dtype == dtype and host.size == numel and (
            host.flags.writeable or not written):
        return
    raise SimAccelError(
        f"{kind} {position} ({name}) is host-mapped and must be a C-contiguous"
        f"{' writeable' if written else ''} {dtype} array of {numel} elements, got "
        f"{host.dtype} shape {host.shape} strides {host.strides}"
        f"{'' if host.flags.writeable else ' (read-only)'}; Dynamo's tensor guard should "
        f"have recompiled this graph (please report this)")


#: the placements a kernel accesses in host memory
MAPPED = frozenset({Placement.MAPPED, Placement.MAPPED_UPDATE})


def bind_mapped(bound: Any, srcs: Sequence[np.ndarray], host_outputs: Sequence[Any],
                data_ptrs: Sequence[int] | None, streamed: Sequence[InputPlan],
                launches: MappedLaunches,
                bind: Callable[[int, dict[str, np.ndarray], dict[str, int]], None]) -> None:
    """Bind each launch that accesses host memory (``launches``: :func:`mapped_steps`) to
    this call's host arrays: ``srcs``, the program's ``streamed`` inputs, and
    ``host_outputs``, the call's output arrays by output position (``bind(k, hosts,
    addresses)`` binds step ``k`` to ``hosts``, buffer -> flat host array, whose data
    addresses (bytes) are ``addresses``). ``bound``: the workspace's
    :class:`~simaccel.runtime.resident.BoundWorkspace`; its bound launches keep their
    arrays alive.

    Each new input array is checked against the compiled layout once, then its address
    compared: a launch that only reads inputs is bound again only when one of them moved
    (a caller passing the same tensor every call binds nothing after the first), while
    one writing an output is bound every call (new output arrays). This runs on every
    call of a program with mapped launches, so the inputs are visited once and, when none
    moved, only the launches writing outputs are (causal attention: four GEMMs read two
    mapped inputs, one kernel writes the output). A launch bound before that can be
    patched (a launch group) has only its moved arguments patched (:func:`_patch`)."""
    bound.mapped_sources = None  # until every launch is bound to these
    addresses = _mapped_addresses(bound, srcs, data_ptrs, streamed, launches)
    last = bound.mapped_addresses
    numel = bound.layout.numel
    for step in launches.steps if addresses != last else launches.writing:
        if not step.outputs and all(addresses[p] == last.get(p) for p in step.inputs):
            continue
        patch = getattr(bound.launches[step.index], "patch", None)
        if patch is not None:  # bound on this workspace before: only some arrays moved
            _patch(step, patch, srcs, addresses, last, streamed, bound, host_outputs)
            continue
        hosts = {streamed[p].buffer: srcs[p].reshape(-1) for p in step.inputs}
        for pos, buffer in step.outputs:
            host = output_array(bound, host_outputs[pos], buffer)
            check_mapped("output", pos, buffer, host, bound.mapped_dtypes[buffer],
                         numel[buffer], written=True)
            # kernels take flat arrays: a view of the (checked C-contiguous) host array;
            # an output's address is read by a kernel that needs it (numba's dispatcher
            # does not)
            hosts[buffer] = host.reshape(-1)
        bind(step.index, hosts, {streamed[p].buffer: addresses[p] for p in step.inputs})
        bound.sequence = None  # a new launch: the recorded command lists go
    bound.mapped_addresses = addresses
    # with no mapped output, the next call on these very arrays binds nothing (the
    # launches hold these arrays already: remembering them keeps nothing else alive)
    bound.mapped_sources = None if launches.writing else \
        list(map(srcs.__getitem__, launches.sources))


def _mapped_addresses(bound: Any, srcs: Sequence[np.ndarray], data_ptrs: Sequence[int] | None,
                      streamed: Sequence[InputPlan], launches: MappedLaunches
                      ) -> dict[int, int]:
    """Streamed position -> data address (bytes) of the mapped input there, for each of
    ``launches.positions``; an array not seen there at the last call is checked first
    (:func:`check_mapped`). This runs on every call of a program with mapped launches
    (an optimizer step: every parameter, state and gradient), so the arrays and the
    caller's addresses are gathered by C-level maps and only new arrays are visited."""
    positions = launches.positions
    hosts = list(map(srcs.__getitem__, positions))
    checked = bound.mapped_checked
    if not all(map(operator.is_, hosts, map(checked.get, positions))):
        numel = bound.layout.numel
        for p, host in zip(positions, hosts):
            if checked.get(p) is not host:
                plan = streamed[p]
                check_mapped("input", plan.index, plan.buffer, host,
                             bound.mapped_dtypes[plan.buffer], numel[plan.buffer],
                             plan.placement is Placement.MAPPED_UPDATE)
                checked[p] = host
    known = list(map(data_ptrs.__getitem__, launches.indices)) if data_ptrs is not None \
        else [0] * len(positions)
    if not all(known):  # an address the caller did not know: numpy's
        known = [data_ptr(i, host, data_ptrs) for i, host in zip(launches.indices, hosts)]
    return dict(zip(positions, known))


def _patch(step: HostBoundStep, patch: Callable[[int, np.ndarray, int], None],
           srcs: Sequence[np.ndarray], addresses: dict[int, int], last: dict[int, int],
           streamed: Sequence[InputPlan], bound: Any, host_outputs: Sequence[Any]) -> None:
    """Point a launch bound before (``patch``: :meth:`simaccel.runtime.group.
    _RecordedLaunch.patch`) at this call's arrays where they moved: the mapped inputs at a
    new address and the mapped outputs (new arrays every call). An optimizer step whose
    gradients are new tensors every step patches one pointer per gradient instead of
    binding its kernels anew."""
    for p in step.inputs:
        if addresses[p] != last.get(p):
            buffer = streamed[p].buffer
            for position in step.arguments[buffer]:
                patch(position, srcs[p].reshape(-1), addresses[p])
    for pos, buffer in step.outputs:
        host = output_array(bound, host_outputs[pos], buffer)
        check_mapped("output", pos, buffer, host, bound.mapped_dtypes[buffer],
                     bound.layout.numel[buffer], written=True)
        flat = host.reshape(-1)
        for position in step.arguments[buffer]:
            patch(position, flat, flat.ctypes.data)


def bound_to(bound: Any, mapped: Sequence[Any]) -> bool:
    """Whether :func:`bind_mapped` bound every mapped launch of ``bound`` to these very
    arrays (``mapped``: the host arrays of the mapped inputs, in streamed order) and no
    launch writes a mapped output: then a call on them binds nothing (kept views pass
    the same arrays)."""
    last = bound.mapped_sources
    return last is not None and all(map(operator.is_, mapped, last))


def output_array(bound: Any, host: Any, buffer: str) -> np.ndarray:
    """The array a mapped output's kernel writes (and the download counts): the caller's,
    or, where the caller left the output out (None), a scratch array of the binding's."""
    if host is not None:
        return host
    scratch = bound.mapped_scratch.get(buffer)
    if scratch is None:
        scratch = bound.mapped_scratch[buffer] = np.empty(bound.layout.numel[buffer],
                                                          bound.mapped_dtypes[buffer])
    return scratch


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

"""From a lowered graph to a runtime :class:`ProgramSpec`: emit, cache and compile
every kernel, wrap host fallbacks.

The passes, in order (each a named function, as in numba's pipelines):

1. ``lower``      ATen graph -> kernel IR + host ops  (:mod:`graph`)
2. ``emit``       kernel IR -> Python source            (:mod:`emit`)
3. ``jit``        source -> machine code via the on-disk cache (:mod:`cache`): numba
                  compiles on a miss; a hit loads a native object without numba.
                  Library kernels (GEMM) need no code: they become launches as they are.
4. ``assemble``   steps + buffers + input plans -> a frozen ProgramSpec (this module)
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from simaccel.codegen import compile_pool, tiered
from simaccel.codegen.cache import DEFAULT_CACHE, KernelCache
from simaccel.codegen.dtypes import STORAGE_DTYPES, byte_view, storage_dtype
from simaccel.codegen.emit import emit_extern, emit_reduction
from simaccel.codegen.emit_pointwise import emit_pointwise
from simaccel.codegen.emit_columns import column_order, emit_column_reduction
from simaccel.codegen.emit_rows import emit_row
from simaccel.codegen.emit_numpy import Unsupported, emit_numpy
from simaccel.codegen.fusion import share_loop_nests
from simaccel.codegen.graph import LoweredGraph
from simaccel.codegen.hostop import HostOp
from simaccel.codegen.lower_scalar_args import number_arguments
from simaccel.codegen.ir import (ExternKernel, LibraryKernel, PointwiseKernel, ReductionKernel,
                                 RowKernel, dense_strides)
from simaccel.codegen.size_args import (evaluate_size, names_of, runtime_size, runtime_sizes,
                                        symbol_sources, with_size_args)
from simaccel.codegen.sizes import is_symbolic
from simaccel.codegen.values import Realized
from simaccel.runtime.group import GroupPart, LaunchGroup
from simaccel.runtime.hostmap import c_order, place_mapped_outputs
from simaccel.runtime.spec import (SIZE_BANK, BufferDecl, HostStep, InputPlan, LaunchStep,
                                   OutputDecl, ProgramSpec)

log = logging.getLogger("simaccel.codegen")

_CACHE = DEFAULT_CACHE


def kernel_cache() -> KernelCache:
    return _CACHE


@dataclass
class KernelInfo:
    """What the compile report shows of one kernel."""

    name: str
    kind: str
    origin: str  # compiled | disk | memory
    path: str
    compile_ms: float


@dataclass
class CompileResult:
    spec: ProgramSpec
    kernels: list[KernelInfo] = field(default_factory=list)
    #: milliseconds waiting for the compile workers (:mod:`.compile_pool`)
    pool_ms: float = 0.0


def _array_type(dtype: str) -> str:
    """numba's name of a flat C array of ``dtype`` (no numba import needed to say it)."""
    return f"array({np.dtype(storage_dtype(dtype)).name}, 1d, C)"


_BUFFER_NAME = re.compile(r"\bbuf\d+\b")
#: a library call's output buffer of at least this many bytes may be a host-mapped output:
#: the call copies its result into the caller's array instead of into device memory and
#: from there into the caller's array again. Below it, the per-call rebinding of the
#: call's tensor views costs more than the copy saved (causal attention's 1 MB output:
#: ~5% slower mapped); a grouped convolution's 6.4 MB output: 12.2 -> 9.6 ms a call
#: mapped (both forms compiled in one process, calls interleaved).
LIBRARY_MAPPED_MIN_BYTES = 4 << 20


def _positional_names(source: str, args: list[str]) -> str:
    """``source`` with its buffer arguments renamed ``_a0, _a1, ...`` by position: two
    kernels that differ only in which buffers they read (the bias + ReLU of two layers of
    the same width) become one source, compiled and cached once."""
    names = {name: f"_a{k}" for k, name in enumerate(args)}
    return _BUFFER_NAME.sub(lambda m: names.get(m.group(0), m.group(0)), source)


def _emit(kernel: Any) -> tuple[str, list[str], list[Any]]:
    if isinstance(kernel, PointwiseKernel):
        source, args = emit_pointwise(kernel)
        return _positional_names(source, args), args, []
    if isinstance(kernel, ReductionKernel):
        emit = emit_column_reduction if column_order(kernel) else emit_reduction
        source, args = emit(kernel)
        return _positional_names(source, args), args, []
    if isinstance(kernel, RowKernel):
        source, args = emit_row(kernel)
        return _positional_names(source, args), args, []
    if isinstance(kernel, ExternKernel):
        return (*emit_extern(kernel), list(kernel.params))
    raise TypeError(f"unknown kernel {type(kernel).__name__}")


def _cost(kernel: Any, lowered: LoweredGraph) -> tuple[float, float]:
    """(flops, bytes) of a kernel for the roofline model; a row kernel moves its largest
    stage's bytes (its later passes over a row hit the cache)."""
    if isinstance(kernel, (ExternKernel, LibraryKernel)):
        return kernel.flops, kernel.bytes_moved
    if isinstance(kernel, RowKernel):
        costs = [_cost(stage, lowered) for stage in kernel.stages]
        return sum(f for f, _ in costs), max(b for _, b in costs)
    parts = [store for part in kernel.parts for store in part.stores] \
        if isinstance(kernel, PointwiseKernel) else [kernel]
    flops = nbytes = 0
    for part in parts:
        itemsize = np.dtype(storage_dtype(lowered.buffers[part.out.buffer].dtype)).itemsize
        flops, nbytes = flops + part.numel, nbytes + part.numel * itemsize * 2
    return flops, nbytes


def library_step(kernel: LibraryKernel, lowered: LoweredGraph) -> tuple[LaunchStep, KernelInfo]:
    """A library call (no code generated): launched on device buffers like any kernel."""
    step = _launch_step(kernel, kernel.fn, kernel.buffers, kernel.params, lowered)
    return step, KernelInfo(kernel.name, "library", "library", kernel.fn.__qualname__, 0.0)


def _launch_step(kernel: Any, fn: Any, buffers: list[str], params: list[Any],
                 lowered: LoweredGraph, size_slots: tuple[str, ...] = ()) -> LaunchStep:
    """The runtime step of ``kernel``: ``fn`` on ``buffers`` and ``params`` (and the size
    bank slots of ``size_slots``), with the buffers the kernel declares it reads and
    writes."""
    flops, nbytes = _cost(kernel, lowered)
    return LaunchStep(kernel.name, fn, tuple(buffers), runtime_sizes(params),
                      runtime_size(flops), runtime_size(nbytes), kernel.reads, kernel.writes,
                      size_slots)


@dataclass
class PreparedKernel:
    """A kernel and its emitted source, with what its launch takes: the numba signature
    (type names), the buffers (with the size bank last when it reads dynamic sizes), the
    launch parameters and the size symbols it reads from the bank."""

    kernel: Any
    source: str
    signature: tuple[str, ...]
    buffers: list[str]
    params: list[Any]
    size_symbols: list[str]
    #: the whole-array numpy form (same signature), None if the kernel has none
    tier0_source: str | None = None


def prepare_kernel(kernel: Any, lowered: LoweredGraph, tier0: bool = False) -> PreparedKernel:
    """The kernel's source, signature and launch arguments (``tier0``: also its numpy
    form, where it has one)."""
    source, buffers, params = _emit(kernel)
    tier0_source = _tier0_source(kernel, buffers) if tier0 else None
    source, size_symbols = with_size_args(source, len(buffers))
    if tier0_source is not None:
        tier0_source, _ = with_size_args(tier0_source, len(buffers), size_symbols)
    signature = tuple(_array_type(lowered.buffers[b].dtype) for b in buffers)
    if size_symbols:  # dynamic sizes: read from the size bank, by slot
        buffers = [*buffers, SIZE_BANK]
        signature += ("array(int64, 1d, C)",)
    signature += tuple("int64" for _ in (*params, *size_symbols))
    return PreparedKernel(kernel, source, signature, buffers, params, list(size_symbols),
                          tier0_source)


def _tier0_source(kernel: Any, buffers: list[str]) -> str | None:
    """The numpy form of ``kernel`` with the numba form's argument names, or None."""
    try:
        return _positional_names(emit_numpy(kernel), buffers)
    except Unsupported as exc:
        log.debug("kernel %s has no tier-0 form: %s", kernel.name, exc)
        return None


#: the runtime_stats() counter of a kernel by where it came from ("pool": a compile
#: worker wrote it, this process loaded it from disk)
ORIGIN_COUNTERS = {"compiled": "kernels_compiled", "pool": "kernels_compiled",
                   "disk": "kernel_cache_hits", "memory": "kernel_memory_hits"}


def jit_kernel(p: PreparedKernel, lowered: LoweredGraph, device: Any,
               pool_compiled: frozenset[str] = frozenset(),
               background: Mapping[str, Any] | None = None) -> tuple[LaunchStep, KernelInfo]:
    """Compile (or load) one prepared kernel and make its launch step; ``pool_compiled``:
    the sources a compile worker compiled for this graph (loaded here from the cache,
    counted as compiled, origin "pool"); ``background``: the futures of the kernels
    compiling in the workers while their tier-0 form runs, by source."""
    kernel = p.kernel
    if background is not None and p.source in background:
        return _tiered_step(p, lowered, device, background[p.source])
    start = time.perf_counter()
    loaded = _CACHE.load(p.source, p.signature)
    elapsed = (time.perf_counter() - start) * 1e3
    origin = "pool" if loaded.origin == "disk" and p.source in pool_compiled else loaded.origin
    device.count(ORIGIN_COUNTERS[origin])
    if os.environ.get("SIMACCEL_DEBUG") == "1":
        log.info("kernel %s (%s, %.1f ms): %s\n%s", kernel.name, origin, elapsed,
                 loaded.path, p.source)
    step = _launch_step(kernel, loaded.fn, p.buffers, p.params, lowered,
                        tuple(p.size_symbols))
    kind = type(kernel).__name__.replace("Kernel", "").lower()
    return step, KernelInfo(kernel.name, kind, origin, str(loaded.path), elapsed)


def _tiered_step(p: PreparedKernel, lowered: LoweredGraph, device: Any,
                 pending: Any) -> tuple[LaunchStep, KernelInfo]:
    """The launch step of a kernel compiling in the background: its tier-0 form until
    the worker is done, then the compiled kernel from the cache."""
    kernel = p.kernel
    kind = type(kernel).__name__.replace("Kernel", "").lower()
    waiting = "loaded after the first call" if compile_pool.is_deferred_load(pending) \
        else "compiling in the background"
    info = KernelInfo(kernel.name, kind, "tier0", f"({waiting})", 0.0)

    def load() -> Any:  # on disk: a worker compiled it, or it was there (a deferred load)
        loaded = _CACHE.load(p.source, p.signature)
        compiled = loaded.origin == "disk" and _worker_origin(pending) != "disk"
        device.count(ORIGIN_COUNTERS["pool" if compiled else loaded.origin])
        info.path = str(loaded.path)  # the report names the compiled kernel from now on
        return loaded.fn
    fn = tiered.TieredKernel(kernel.name, tiered.load_tier0(p.tier0_source), pending, load,
                             device)
    step = _launch_step(kernel, fn, p.buffers, p.params, lowered, tuple(p.size_symbols))
    return step, info


def _worker_origin(pending: Any) -> str | None:
    """Where the worker found a background kernel ("compiled", "disk"); None if it
    failed (this process compiled it then)."""
    try:
        return pending.result()
    except Exception:  # noqa: BLE001 - TieredKernel._switch logged it
        return None


def _compile_in_pool(kernels: list[Any], lowered: LoweredGraph, tier0: bool | str) -> tuple[
        dict[int, PreparedKernel], frozenset[str], dict[str, Any]]:
    """Every kernel's prepared form (by ``id``), after the ones missing from the cache
    compiled in the worker pool (:mod:`simaccel.codegen.compile_pool`); the sources the
    workers compiled; and (``tier0``) the futures of the misses with a tier-0 form, which
    compile in the background instead, and of the hits only numba can load, loaded after
    the first call (:func:`~simaccel.codegen.compile_pool.defer_loads`), by source
    (``tier0="only"``: every kernel with a tier-0 form, future None: never compiled)."""
    if tier0 == "only":
        prepared = {id(k): prepare_kernel(k, lowered, True) for k in kernels}
        return prepared, frozenset(), {p.source: None for p in prepared.values()
                                       if p.tier0_source is not None}
    parallel = compile_pool.parallel()
    prepared = {id(k): prepare_kernel(k, lowered, bool(tier0) and parallel) for k in kernels}
    if not parallel:  # serial: no need to look for misses on disk (and no tier 0)
        return prepared, frozenset(), {}
    missing = {p.source: p for p in prepared.values() if not _CACHE.has(p.source, p.signature)}
    later = [(s, p.signature) for s, p in missing.items() if p.tier0_source is not None]
    # in the cache, but only numba can load them: tier 0 until the first call returns
    numba_only = [p.source for p in prepared.values() if tier0 and p.source not in missing
                  and p.tier0_source is not None and _CACHE.needs_numba(p.source, p.signature)]
    now = [(s, p.signature) for s, p in missing.items() if p.tier0_source is None]
    # the kernels this call cannot run without go to the workers now (even a few, when
    # the graph's background compiles start the workers anyway); those have a tier-0
    # form and reach the workers when the first call returns (deferred)
    waited = compile_pool.submit(_CACHE.root, now) \
        if now and (compile_pool.worth_sending(len(now)) or later) else {}
    background = {source: future for future, source in
                  compile_pool.submit_deferred(_CACHE.root, later).items()} if later else {}
    background.update({source: future for future, source in
                       compile_pool.defer_loads(numba_only).items()})
    return prepared, frozenset(compile_pool.collect(waited)), background


def _library_copied(lowered: LoweredGraph, buffers: dict[str, BufferDecl],
                    aliases: dict[str, str]) -> set[str]:
    """Buffers written by a library call that computes into a tensor of its own, too
    small for mapping to pay (:data:`LIBRARY_MAPPED_MIN_BYTES`): never host-mapped
    outputs (:func:`~simaccel.runtime.hostmap.place_mapped_outputs`)."""
    copied = set()
    for item in lowered.steps:
        if not isinstance(item, LibraryKernel) or getattr(item.fn, "writes_output_in_place",
                                                          False):
            continue
        for buffer in (aliases.get(name, name) for name in item.writes):
            decl = buffers.get(buffer)
            if decl is None or not isinstance(decl.numel, int) \
                    or decl.nbytes < LIBRARY_MAPPED_MIN_BYTES:
                copied.add(buffer)
    return copied


def _own_parts(kernel: PointwiseKernel) -> list[PointwiseKernel]:
    """The parts of a fused pointwise launch, each a kernel of its own (parts that can
    share a loop nest: one kernel, :func:`~simaccel.codegen.fusion.share_loop_nests`)."""
    # copies: the launch's own parts stay as lowered (its cost counts each once)
    return share_loop_nests([dataclasses.replace(part, siblings=[], mates=[])
                             for part in kernel.parts])


def group_step(kernel: PointwiseKernel, parts: list[LaunchStep],
               lowered: LoweredGraph) -> LaunchStep:
    """One launch of the compiled ``parts`` of a fused pointwise kernel, in order
    (:class:`~simaccel.runtime.group.LaunchGroup`): their arguments concatenated, their
    declared reads and writes united, their roofline costs summed."""
    group = LaunchGroup([GroupPart(p.fn, len(p.buffers), len(p.params), len(p.size_slots))
                         for p in parts])
    flops, nbytes = _cost(kernel, lowered)
    return LaunchStep(kernel.name, group, tuple(b for p in parts for b in p.buffers),
                      tuple(q for p in parts for q in p.params), runtime_size(flops),
                      runtime_size(nbytes), kernel.reads, kernel.writes,
                      tuple(s for p in parts for s in p.size_slots))


def host_step(op: HostOp) -> HostStep:
    """Wrap a fallback op: rebuild torch tensors over the host copies, run, write back."""
    reads = tuple(sorted(op.reads))
    writes = tuple(o.layout.buffer for o in op.outputs if o is not None)
    numbers = number_arguments(op.target)  # lifted scalars go in as Python numbers

    def run(host: dict[str, np.ndarray], sizes: Mapping[str, int]) -> None:
        args, kwargs = numbers.apply(_to_torch(op.args, host, sizes),
                                     _to_torch(op.kwargs, host, sizes))
        result = op.target(*args, **kwargs)
        results = list(result) if isinstance(result, (list, tuple)) else [result]
        for value, out in zip(results, op.outputs):
            if out is not None:
                _tensor_over(host[out.layout.buffer], out, sizes).copy_(value)
    return HostStep(op.name, run, reads, writes, _sizes_named(op))


def _sizes_named(op: HostOp) -> tuple[Any, ...]:
    """The dynamic sizes a host op's arguments and results hold (runtime form)."""
    found: list[Any] = []

    def visit(obj: Any) -> None:
        if isinstance(obj, Realized):
            lay = obj.layout
            found.extend(runtime_sizes([*lay.shape, *lay.strides, lay.offset]))
        elif isinstance(obj, (list, tuple)):
            for o in obj:
                visit(o)
        elif isinstance(obj, dict):
            for o in obj.values():
                visit(o)
        elif isinstance(obj, (torch.SymInt, torch.SymFloat)):
            found.append(runtime_size(obj))
    visit((op.args, op.kwargs, [o for o in op.outputs if o is not None]))
    return tuple(s for s in found if isinstance(s, str))


def _tensor_over(array: np.ndarray, value: Realized, sizes: Mapping[str, int]) -> torch.Tensor:
    """A torch tensor aliasing ``array`` with ``value``'s layout (its dynamic sizes at
    this call's ``sizes``) and dtype."""
    base = torch.from_numpy(array)
    if value.dtype in STORAGE_DTYPES:  # raw bytes of a dtype numpy lacks
        base = base.view(getattr(torch, value.dtype))
    lay = value.layout
    return base.as_strided(_to_torch(lay.shape, {}, sizes), _to_torch(lay.strides, {}, sizes),
                           _to_torch(lay.offset, {}, sizes))


def _to_torch(obj: Any, host: dict[str, np.ndarray], sizes: Mapping[str, int]) -> Any:
    """``obj`` (a host op's argument) with Realized values as tensors over the host copies
    and dynamic sizes as this call's ints."""
    if isinstance(obj, Realized):
        return _tensor_over(host[obj.layout.buffer], obj, sizes)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_torch(o, host, sizes) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_torch(v, host, sizes) for k, v in obj.items()}
    if isinstance(obj, (torch.SymInt, torch.SymFloat)):
        return evaluate_size(obj, sizes)
    return obj


def assemble(lowered: LoweredGraph, inputs: tuple[InputPlan, ...], device: Any, name: str,
             size_bounds: dict[str, int] | None = None,
             tier0: bool | str = False) -> CompileResult:
    """Compile every step of ``lowered`` and build the frozen program spec; ``inputs``:
    the graph's input plans (:func:`simaccel.input_plan.plan_inputs`); ``size_bounds``:
    the size each symbol's memory is planned for (static-shape mode), by name;
    ``tier0``: kernels missing from the cache start in their tier-0 form while the
    workers compile them (:mod:`simaccel.codegen.tiered`); "only": every kernel with a
    tier-0 form runs it and is never compiled."""
    steps: list[LaunchStep | HostStep] = []
    infos: list[KernelInfo] = []
    parts = {id(item): _own_parts(item) if isinstance(item, PointwiseKernel) else [item]
             for item in lowered.steps if not isinstance(item, (HostOp, LibraryKernel))}
    pool_start = time.perf_counter()
    prepared, pooled, background = _compile_in_pool(
        [k for ks in parts.values() for k in ks], lowered, tier0)
    pool_ms = (time.perf_counter() - pool_start) * 1e3 if pooled or background else 0.0

    def jit(kernel: Any) -> tuple[LaunchStep, KernelInfo]:
        return jit_kernel(prepared[id(kernel)], lowered, device, pooled, background)

    for item in lowered.steps:
        if isinstance(item, HostOp):
            steps.append(host_step(item))
            continue
        if isinstance(item, LibraryKernel):
            step, info = library_step(item, lowered)
            infos.append(info)
        elif len(parts[id(item)]) > 1:
            jitted = [jit(part) for part in parts[id(item)]]
            step = group_step(item, [p for p, _ in jitted], lowered)
            infos += [info for _, info in jitted]
        else:
            step, info = jit(parts[id(item)][0])
            infos.append(info)
        steps.append(step)
    aliases = lowered.aliases
    buffers = {n: BufferDecl(n, storage_dtype(b.dtype), runtime_size(b.numel), b.kind)
               for n, b in lowered.buffers.items() if n not in aliases}
    if aliases:  # a write-back computed in place: its kernels use the input's buffer
        steps = [_renamed(step, aliases) for step in steps]
    constants = {n: _host_array(t) for n, t in lowered.constants.items()}
    # input write-backs ride after the graph's outputs: read back the same way, into the
    # caller's tensors (``spec.writebacks``)
    written = [value for _, value in lowered.writebacks]
    outputs = tuple(OutputDecl(aliases.get(o.layout.buffer, o.layout.buffer),
                               runtime_sizes(o.shape),
                               runtime_sizes(o.layout.strides), runtime_size(o.layout.offset),
                               storage_dtype(o.dtype)) if isinstance(o, Realized) else None
                    for o in [*lowered.outputs, *written])
    outputs = place_mapped_outputs(
        outputs, steps, inputs, {n: b.numel for n, b in buffers.items()},
        {n: b.itemsize for n, b in buffers.items()},
        [host_c_contiguous(m) for m in lowered.output_meta] + [False] * len(written),
        device.config.host_map_min_bytes, len(lowered.outputs),
        _library_copied(lowered, buffers, aliases))
    asserts = tuple(lowered.size_asserts)
    symbols, traced = symbol_sources(lowered.inputs, _size_names(buffers, steps, outputs)
                                     + names_of(text for text, _ in asserts))
    bounds = size_bounds or {}
    plan_sizes = tuple(max(bounds.get(src.symbol, n), n) for src, n in zip(symbols, traced)) \
        if bounds else ()
    spec = ProgramSpec(name, buffers, tuple(steps), inputs, constants, outputs,
                       int(device.config.alignment), symbols, traced, plan_sizes,
                       tuple(index for index, _ in lowered.writebacks), asserts)
    return CompileResult(spec, infos, pool_ms)


def host_c_contiguous(meta: Any) -> bool:
    """True if the host array a call allocates for an output of this traced value is
    C-contiguous: :class:`simaccel.compiled.HostOutputs` gives it eager's strides when
    they are dense and contiguous ones otherwise (static sizes only)."""
    if not isinstance(meta, torch.Tensor) or any(is_symbolic(v) for v in
                                                  (*meta.shape, *meta.stride())):
        return False
    shape, stride = tuple(meta.shape), tuple(meta.stride())
    return not dense_strides(shape, stride) or c_order(shape, stride)


def _renamed(step: LaunchStep | HostStep, aliases: dict[str, str]) -> LaunchStep | HostStep:
    """``step`` naming ``aliases[b]`` for each buffer ``b`` it names (only kernels take
    aliased buffers: :func:`simaccel.codegen.inplace.inplace_writebacks`)."""
    if not isinstance(step, LaunchStep) or not aliases.keys() & (step.reads | step.writes):
        return step
    return dataclasses.replace(
        step, buffers=tuple(aliases.get(b, b) for b in step.buffers),
        reads=frozenset(aliases.get(b, b) for b in step.reads),
        writes=frozenset(aliases.get(b, b) for b in step.writes))


def _size_names(buffers: dict[str, BufferDecl], steps: list[Any],
                outputs: tuple[OutputDecl | None, ...]) -> list[str]:
    """Every size symbol the program's sizes name."""
    sizes: list[Any] = [b.numel for b in buffers.values()]
    for step in steps:
        if isinstance(step, LaunchStep):
            sizes += [*step.params, *step.size_slots, step.flops, step.nbytes]
        else:
            sizes += list(step.sizes)
    for out in outputs:
        if out is not None:
            sizes += [*out.shape, *out.strides, out.offset]
    return names_of(sizes)


def _host_array(t: torch.Tensor) -> np.ndarray:
    return byte_view(t.detach().contiguous()).numpy()

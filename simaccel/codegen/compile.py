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

import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from simaccel.codegen.cache import KernelCache
from simaccel.codegen.dtypes import STORAGE_DTYPES, byte_view, storage_dtype
from simaccel.codegen.emit import emit_extern, emit_pointwise, emit_reduction
from simaccel.codegen.graph import LoweredGraph
from simaccel.codegen.hostop import HostOp
from simaccel.codegen.ir import ExternKernel, LibraryKernel, PointwiseKernel, ReductionKernel
from simaccel.codegen.values import Realized
from simaccel.runtime.spec import (BufferDecl, HostStep, InputPlan, LaunchStep, OutputDecl,
                                   ProgramSpec)

log = logging.getLogger("simaccel.codegen")

_CACHE = KernelCache()


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


def _array_type(dtype: str) -> str:
    """numba's name of a flat C array of ``dtype`` (no numba import needed to say it)."""
    return f"array({np.dtype(storage_dtype(dtype)).name}, 1d, C)"


_BUFFER_NAME = re.compile(r"\bbuf\d+\b")


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
        source, args = emit_reduction(kernel)
        return _positional_names(source, args), args, []
    if isinstance(kernel, ExternKernel):
        return (*emit_extern(kernel), list(kernel.params))
    raise TypeError(f"unknown kernel {type(kernel).__name__}")


def _cost(kernel: Any, lowered: LoweredGraph) -> tuple[float, float]:
    """(flops, bytes) of a kernel for the roofline model."""
    if isinstance(kernel, (ExternKernel, LibraryKernel)):
        return kernel.flops, kernel.bytes_moved
    numel = kernel.numel
    itemsize = np.dtype(storage_dtype(lowered.buffers[kernel.out.buffer].dtype)).itemsize
    return float(numel), float(numel * itemsize * 2)


def library_step(kernel: LibraryKernel, lowered: LoweredGraph) -> tuple[LaunchStep, KernelInfo]:
    """A library call (no code generated): launched on device buffers like any kernel."""
    step = _launch_step(kernel, kernel.fn, kernel.buffers, kernel.params, lowered)
    return step, KernelInfo(kernel.name, "library", "library", kernel.fn.__qualname__, 0.0)


def _launch_step(kernel: Any, fn: Any, buffers: list[str], params: list[Any],
                 lowered: LoweredGraph) -> LaunchStep:
    """The runtime step of ``kernel``: ``fn`` on ``buffers`` and ``params``, with the
    buffers the kernel declares it reads and writes."""
    flops, nbytes = _cost(kernel, lowered)
    return LaunchStep(kernel.name, fn, tuple(buffers), tuple(params), flops, nbytes,
                      kernel.reads, kernel.writes)


def jit_kernel(kernel: Any, lowered: LoweredGraph, device: Any) -> tuple[LaunchStep, KernelInfo]:
    source, buffers, params = _emit(kernel)
    signature = tuple(_array_type(lowered.buffers[b].dtype) for b in buffers)
    signature += tuple("int64" for _ in params)
    start = time.perf_counter()
    loaded = _CACHE.load(source, signature)
    elapsed = (time.perf_counter() - start) * 1e3
    counter = {"compiled": "kernels_compiled", "disk": "kernel_cache_hits",
               "memory": "kernel_memory_hits"}[loaded.origin]
    device.count(counter)
    if os.environ.get("SIMACCEL_DEBUG") == "1":
        log.info("kernel %s (%s, %.1f ms): %s\n%s", kernel.name, loaded.origin, elapsed,
                 loaded.path, source)
    step = _launch_step(kernel, loaded.fn, buffers, params, lowered)
    kind = type(kernel).__name__.replace("Kernel", "").lower()
    return step, KernelInfo(kernel.name, kind, loaded.origin, str(loaded.path), elapsed)


def host_step(op: HostOp) -> HostStep:
    """Wrap a fallback op: rebuild torch tensors over the host copies, run, write back."""
    reads = tuple(sorted(op.reads))
    writes = tuple(o.layout.buffer for o in op.outputs if o is not None)

    def run(host: dict[str, np.ndarray]) -> None:
        args = _to_torch(op.args, host)
        kwargs = _to_torch(op.kwargs, host)
        result = op.target(*args, **kwargs)
        results = list(result) if isinstance(result, (list, tuple)) else [result]
        for value, out in zip(results, op.outputs):
            if out is not None:
                _tensor_over(host[out.layout.buffer], out).copy_(value)
    return HostStep(op.name, run, reads, writes)


def _tensor_over(array: np.ndarray, value: Realized) -> torch.Tensor:
    """A torch tensor aliasing ``array`` with ``value``'s layout and dtype."""
    base = torch.from_numpy(array)
    if value.dtype in STORAGE_DTYPES:  # raw bytes of a dtype numpy lacks
        base = base.view(getattr(torch, value.dtype))
    lay = value.layout
    return base.as_strided(lay.shape, lay.strides, lay.offset)


def _to_torch(obj: Any, host: dict[str, np.ndarray]) -> Any:
    if isinstance(obj, Realized):
        return _tensor_over(host[obj.layout.buffer], obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_torch(o, host) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_torch(v, host) for k, v in obj.items()}
    return obj


def assemble(lowered: LoweredGraph, inputs: tuple[InputPlan, ...], device: Any, name: str
             ) -> CompileResult:
    """Compile every step of ``lowered`` and build the frozen program spec; ``inputs``:
    the graph's input plans (:func:`simaccel.input_plan.plan_inputs`)."""
    steps: list[LaunchStep | HostStep] = []
    infos: list[KernelInfo] = []
    for item in lowered.steps:
        if isinstance(item, HostOp):
            steps.append(host_step(item))
            continue
        if isinstance(item, LibraryKernel):
            step, info = library_step(item, lowered)
        else:
            step, info = jit_kernel(item, lowered, device)
        steps.append(step)
        infos.append(info)
    buffers = {n: BufferDecl(n, storage_dtype(b.dtype), b.numel, b.kind)
               for n, b in lowered.buffers.items()}
    constants = {n: _host_array(t) for n, t in lowered.constants.items()}
    outputs = tuple(OutputDecl(o.layout.buffer, o.shape, o.layout.strides, o.layout.offset,
                               storage_dtype(o.dtype)) if isinstance(o, Realized) else None
                    for o in lowered.outputs)
    spec = ProgramSpec(name, buffers, tuple(steps), inputs, constants, outputs,
                       int(device.config.alignment))
    return CompileResult(spec, infos)


def _host_array(t: torch.Tensor) -> np.ndarray:
    return byte_view(t.detach().contiguous()).numpy()

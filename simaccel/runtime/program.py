"""A compiled graph on the device: a memory plan and an ordered list of steps.

Each call: one workspace block is taken from the caching allocator (every input,
intermediate and output buffer has a planned offset in it), inputs are DMA'd host to
device (a large input only one kernel reads is host-mapped instead: that kernel reads the
host array in place, see :mod:`simaccel.runtime.hostmap`), lifted scalars go to the
resident constant bank (one transfer, and only when a value changed), kernels run on
device buffers, outputs are DMA'd back, and the workspace is freed. Constants
(``get_attr`` tensors) stay resident across calls.

This module knows nothing of torch: buffers are numpy arrays over device memory.
"""
from __future__ import annotations

import functools
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from simaccel.dma import Descriptor
from simaccel.errors import SimAccelError
from simaccel.runtime.constbank import ConstantBank
from simaccel.runtime.device import Device
from simaccel.runtime.hostmap import check_mapped, host_mapped_inputs, mapped_steps
from simaccel.runtime.memory import Block
from simaccel.runtime.planner import MemoryPlan, PlanBuffer, plan_memory

@dataclass
class BufferDecl:
    """A device buffer: dtype (numpy name), element count, kind
    (input, scalar, constant, temp)."""

    name: str
    dtype: str
    numel: int
    kind: str

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize


@dataclass
class LaunchStep:
    """Launch ``fn(*buffers, *params)`` on device buffers; ``flops``/``nbytes`` feed the
    roofline timing model. ``writes``: the buffers the kernel stores to; None when unknown
    (it may write any of its buffers)."""

    name: str
    fn: Callable[..., Any]
    buffers: list[str]
    params: list[Any]
    flops: float
    nbytes: float
    writes: list[str] | None = None


@dataclass
class HostStep:
    """Run ``fn(views)`` on the host (a fallback op); ``reads`` are copied device to host
    first and ``writes`` host to device after, by DMA."""

    name: str
    fn: Callable[[dict[str, np.ndarray]], None]
    reads: list[str]
    writes: list[str]


@dataclass
class OutputDecl:
    """Graph output: a strided view (elements) of a device buffer."""

    buffer: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    dtype: str


@dataclass
class ProgramSpec:
    buffers: dict[str, BufferDecl]
    steps: list[LaunchStep | HostStep]
    tensor_inputs: list[tuple[int, str]]  # (argument index, buffer)
    scalar_inputs: list[tuple[int, str]]
    constants: dict[str, np.ndarray]
    outputs: list[OutputDecl | None]
    name: str = "graph"
    #: DMA plan by argument index: True = direct descriptor, False = staged; inputs not
    #: listed are checked per call.
    aligned_inputs: dict[int, bool] = field(default_factory=dict)
    #: argument indices of tensor inputs whose host layout is C-contiguous (pinned by the
    #: frame's tensor guards): only those can be read in place (host-mapped)
    contiguous_inputs: frozenset[int] = frozenset()


def step_buffers(step: LaunchStep | HostStep) -> list[str]:
    return step.buffers if isinstance(step, LaunchStep) else step.reads + step.writes


def build_plan(spec: ProgramSpec, alignment: int, resident: frozenset[str] = frozenset()
               ) -> MemoryPlan:
    """Offsets of the per-call buffers by liveness over the step list (``resident``
    buffers live in blocks of their own, or in host memory when host-mapped, and take no
    workspace)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    n = len(spec.steps)
    for _, name in spec.tensor_inputs:
        first[name] = 0
        last[name] = 0
    for k, step in enumerate(spec.steps, start=1):
        for name in step_buffers(step):
            first.setdefault(name, k)
            last[name] = k
    for out in spec.outputs:
        if out is not None:
            first.setdefault(out.buffer, n + 1)
            last[out.buffer] = n + 1
    buffers = [PlanBuffer(name, decl.nbytes, first.get(name, 0), last.get(name, 0))
               for name, decl in spec.buffers.items()
               if decl.kind not in ("constant", "scalar") and name in first
               and name not in resident]
    return plan_memory(buffers, alignment)


class Program:
    """Runs a :class:`ProgramSpec` on a :class:`Device`. Calls are serialised per program
    (its resident constant bank is shared state); different programs run concurrently."""

    def __init__(self, device: Device, spec: ProgramSpec):
        self.device = device
        self.spec = spec
        self._lock = threading.Lock()
        self._resident: dict[str, Any] = {}
        self._generation = -1
        #: (workspace offset, views) of the workspace in use; None after it changed
        self._view_cache: tuple[int, dict[str, Any]] | None = None
        self._bank = ConstantBank([(i, n, np.dtype(spec.buffers[n].dtype))
                                   for i, n in spec.scalar_inputs])
        self._resident_inputs: dict[int, str] = {}  # argument index -> buffer
        self._split_inputs()
        self._resident_keys: dict[str, Any] = {}
        self._durations: list[float] = []
        self._kernel_wall_ns = 0
        self._launches_per_call = sum(isinstance(st, LaunchStep) for st in spec.steps)
        self._finalizer = weakref.finalize(self, _free_resident, self._resident)
        device.register_program(self)

    def set_resident_inputs(self, indices: set[int]) -> None:
        """Keep these tensor inputs (parameters, buffers) resident on the device: uploaded
        once, and again only when the key passed with a call changes."""
        by_index = dict(self.spec.tensor_inputs)
        with self._lock:
            self._resident_inputs = {i: by_index[i] for i in sorted(indices) if i in by_index}
            self._split_inputs()

    @property
    def host_mapped(self) -> dict[int, str]:
        """The inputs (argument index -> buffer) a kernel reads in place from host memory."""
        return dict(self._mapped)

    def _split_inputs(self) -> None:
        """Sort the per-call inputs into copied and host-mapped ones and plan the workspace
        (resident and mapped inputs take none of it): at construction, after
        :meth:`set_resident_inputs` and after a reconfigure changed the mapping threshold."""
        spec, config = self.spec, self.device.config
        #: (argument index, buffer) of the inputs moved in on every call (copied or mapped)
        self._streamed_inputs = [(i, n) for i, n in spec.tensor_inputs
                                 if i not in self._resident_inputs]
        self._streamed_labels = [name for _, name in self._streamed_inputs]
        self._map_min_bytes = config.host_map_min_bytes
        self._mapped = host_mapped_inputs(spec, self._streamed_inputs, self._map_min_bytes)
        #: per streamed input: mapped or copied (None: all copied, the engine's fast path)
        self._mapped_flags = [i in self._mapped for i, _ in self._streamed_inputs] \
            if self._mapped else None
        self._mapped_steps = mapped_steps(spec, self._streamed_inputs, self._mapped)
        #: (position in the streamed list, argument index, buffer, dtype, elements) of each
        #: mapped input, checked on every call
        self._mapped_meta = [(p, i, n, np.dtype(spec.buffers[n].dtype), spec.buffers[n].numel)
                             for p, (i, n) in enumerate(self._streamed_inputs)
                             if i in self._mapped]
        off_workspace = {*self._resident_inputs.values(), *self._mapped.values()}
        self.plan = build_plan(spec, config.alignment, frozenset(off_workspace))
        self._view_cache = None

    # ------------------------------------------------------------------ resident state

    def _ensure_resident(self) -> None:
        """Upload constants and create the constant bank (again after a reconfigure)."""
        device = self.device
        if self._generation == device.generation:
            return
        _free_resident(self._resident)
        self._view_cache = None
        self._resident_keys.clear()
        if device.config.host_map_min_bytes != self._map_min_bytes:
            self._split_inputs()
        nbytes = sum(self.spec.buffers[n].nbytes for n in self.spec.constants)
        nbytes += self._bank.nbytes + device.config.alignment * (len(self.spec.constants) + 1)
        block = device.allocator.malloc(nbytes)
        self._resident.update(allocator=device.allocator, block=block, views={}, inputs=[])
        offset = block.offset
        descs = []
        for name, host in self.spec.constants.items():
            decl = self.spec.buffers[name]
            view = device.memory.view(offset, np.dtype(decl.dtype), decl.numel)
            self._resident["views"][name] = view
            descs.append(Descriptor(np.ascontiguousarray(host).reshape(-1), view, "h2d", name))
            offset = _align(offset + decl.nbytes, device.config.alignment)
        self._resident["bank"] = device.memory.view(offset, np.dtype(np.uint8),
                                                     self._bank.nbytes)
        self._bank.valid = False
        if descs:
            device.dma.submit(descs)
            device.count("resident_uploads", len(descs))
            device.count("resident_bytes", sum(d.nbytes for d in descs))
        self._durations = [device.kernel_time_ns(st.flops, st.nbytes)
                           if isinstance(st, LaunchStep) else 0.0 for st in self.spec.steps]
        self._generation = device.generation

    def _bank_views(self) -> dict[str, np.ndarray]:
        return self._bank.views(self._resident["bank"])

    # ------------------------------------------------------------------ per call

    def run(self, args: list[Any], host_outputs: list[np.ndarray | None],
            resident_keys: dict[int, Any] | None = None,
            data_ptrs: list[int] | None = None) -> None:
        """Execute once: ``args`` are host arrays / Python scalars by argument index;
        each tensor output is copied into ``host_outputs[k]``. ``resident_keys`` identify
        the current contents of resident inputs (same key: no upload). ``data_ptrs``: the
        address of each tensor argument's first element (bytes), where the caller knows it
        cheaply; read from the arrays otherwise."""
        device = self.device
        with self._lock:
            if self._generation != device.generation:
                self._ensure_resident()
            ready = self._upload_resident(args, resident_keys) if self._resident_inputs else 0.0
            views = self._views(self._workspace())
            ready = max(ready, self._upload(views, args, data_ptrs))
            end = self._launch_all(views, ready)
            self._download(views, host_outputs, end)
        device.count_call(self._launches_per_call, self._kernel_wall_ns)

    def _workspace(self) -> Block:
        """The program's workspace block (planned offsets of every per-call buffer).

        Like an XLA executable's temp buffer it is allocated at the first call and kept
        until the program is garbage collected; under memory pressure the device asks idle
        programs to give theirs back before it reports out-of-memory."""
        block = self._resident.get("workspace")
        if block is None:
            # One OOM is counted only if the request fails after idle programs gave back
            # their workspaces, as PyTorch counts one per OOM raised to the user.
            block = self.device.allocator.try_malloc(self.plan.total_bytes)
            if block is None:
                self.device.release_idle_workspaces(keep=self)
                block = self.device.allocator.malloc(self.plan.total_bytes)
            self._resident["workspace"] = block
        return block

    def release_workspace(self) -> int:
        """Free the workspace if no call is running; returns the bytes released."""
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            block = self._resident.pop("workspace", None)
            if block is None:
                return 0
            self._resident["allocator"].free(block)
            self._view_cache = None
            return block.size
        finally:
            self._lock.release()

    def _views(self, block: Block) -> dict[str, Any]:
        if self._view_cache is not None and self._view_cache[0] == block.offset:
            return self._view_cache[1]
        memory = self.device.memory
        views: dict[str, Any] = dict(self._resident["views"])
        views.update(self._bank_views())
        for name, off in self.plan.offsets.items():
            decl = self.spec.buffers[name]
            views[name] = memory.view(block.offset + off, np.dtype(decl.dtype), decl.numel)
        views[_OUTPUT_COPIES] = [(k, _output_view(views, out), out.buffer)
                                 for k, out in enumerate(self.spec.outputs) if out is not None]
        views[_INPUT_DSTS] = [views.get(name) for _, name in self._streamed_inputs]
        mapped = {k for k, _ in self._mapped_steps}
        views[_STEP_ARGS] = [_unbound if k in mapped else
                             _bind(step.fn, [views[b] for b in step.buffers] + list(step.params))
                             if isinstance(step, LaunchStep) else None
                             for k, step in enumerate(self.spec.steps)]
        views[_MAPPED_KEYS] = {}  # step index -> data pointers its launch is bound to
        self._view_cache = (block.offset, views)
        return views

    def _upload(self, views: dict[str, np.ndarray], args: list[Any],
                data_ptrs: list[int] | None) -> float:
        """DMA the per-call tensor inputs (one scatter-gather submit) and, if a lifted
        scalar changed, the constant bank (one descriptor); returns when both are done (ns)."""
        dma = self.device.dma
        end = 0.0
        if self._streamed_inputs:
            srcs = [args[index] for index, _ in self._streamed_inputs]
            staged = [not self._aligned(index, name, host, data_ptrs)
                      for (index, name), host in zip(self._streamed_inputs, srcs)]
            dsts = views[_INPUT_DSTS]
            if not all(host.size for host in srcs):  # empty inputs: nothing to address
                dsts = [d if h.size else d[:0] for d, h in zip(dsts, srcs)]
            if self._mapped_flags is not None:
                self._bind_mapped(views, srcs, data_ptrs)
            # mapped inputs ride in the same submit: one h2d transfer per call
            end = dma.copy_many("h2d", srcs, dsts, self._streamed_labels, staged=staged,
                                mapped=self._mapped_flags)
        if self.spec.scalar_inputs and self._bank.pack(args):
            bank = self._resident["bank"]
            end = max(end, dma.copy_one("const", self._bank.host, bank, "constant bank"))
        return end

    def _bind_mapped(self, views: dict[str, Any], srcs: list[np.ndarray],
                     data_ptrs: list[int] | None) -> None:
        """Bind each launch that reads a host-mapped input to this call's host arrays, unless
        it is bound to the same addresses already (a caller passing the same tensor every
        call binds nothing after the first). The bound launch keeps its arrays alive, so an
        address seen again is the same live memory."""
        for p, index, name, dtype, numel in self._mapped_meta:
            check_mapped(index, name, srcs[p], dtype, numel)
        launches, bound = views[_STEP_ARGS], views[_MAPPED_KEYS]
        for k, positions in self._mapped_steps:
            key = tuple(_data_ptr(self._streamed_inputs[p][0], srcs[p], data_ptrs)
                        for p in positions)
            if bound.get(k) == key:
                continue
            # kernels take flat arrays: a view of the (checked C-contiguous) host array
            hosts = {self._streamed_inputs[p][1]: srcs[p].reshape(-1) for p in positions}
            step = self.spec.steps[k]
            launches[k] = _bind(step.fn, [hosts[b] if b in hosts else views[b]
                                          for b in step.buffers] + list(step.params))
            bound[k] = key

    def _aligned(self, index: int, name: str, host: np.ndarray,
                 data_ptrs: list[int] | None) -> bool:
        """True if the input can take a direct descriptor (its address is a multiple of
        ``DeviceConfig.alignment``); it must agree with the program's DMA plan."""
        if not host.size:  # an empty tensor moves nothing: its pointer is not in the plan
            return True
        aligned = _data_ptr(index, host, data_ptrs) % self.device.config.alignment == 0
        planned = self.spec.aligned_inputs.get(index)
        if planned is not None and planned != aligned:
            raise SimAccelError(
                f"input {index} ({name}) was compiled for a {'direct' if planned else 'staged'} "
                f"DMA but is {'' if aligned else 'mis'}aligned now; the alignment guard should "
                f"have recompiled this graph (please report this)")
        return aligned

    def _upload_resident(self, args: list[Any], keys: dict[int, Any] | None) -> float:
        """Upload resident inputs whose key changed (first call, in-place update, new
        tensor); one scatter-gather submit for all of them."""
        keys = keys or {}
        srcs, dsts, labels, staged = [], [], [], []
        for index, name in self._resident_inputs.items():
            key = keys.get(index)
            if key is not None and self._resident_keys.get(name) == key:
                continue
            srcs.append(args[index])
            dsts.append(self._resident_view(name))
            labels.append(name)
            staged.append(not self._aligned(index, name, args[index], None))
            self._resident_keys[name] = key
        if not srcs:
            return 0.0
        self.device.count("resident_uploads", len(srcs))
        self.device.count("resident_bytes", sum(d.nbytes for d in dsts))
        return self.device.dma.copy_many("h2d", srcs, dsts, labels, staged=staged)

    def _resident_view(self, name: str) -> np.ndarray:
        views = self._resident["views"]
        if name not in views:
            decl = self.spec.buffers[name]
            block = self.device.allocator.malloc(decl.nbytes)
            self._resident["inputs"].append(block)
            views[name] = self.device.memory.view(block.offset, np.dtype(decl.dtype), decl.numel)
            self._view_cache = None
        return views[name]

    def _launch_all(self, views: dict[str, Any], ready_ns: float) -> float:
        device = self.device
        schedule = device.dma.schedule_compute
        clock = time.perf_counter_ns
        end = ready_ns
        wall = 0
        for step, launch, duration in zip(self.spec.steps, views[_STEP_ARGS], self._durations):
            if launch is not None:
                with device.compute_lock:
                    t0 = clock()
                    launch()
                    wall += clock() - t0
                end = schedule(step.name, duration, end)[1]
            else:
                end = self._run_host(step, views, end)
        self._kernel_wall_ns = wall
        return end

    def _run_host(self, step: HostStep, views: dict[str, np.ndarray], ready_ns: float) -> float:
        """A fallback op: its operands go device->host and its results host->device."""
        dma = self.device.dma
        host = {name: np.empty_like(views[name]) for name in step.reads}
        descs = [Descriptor(views[n], host[n], "d2h", n) for n in step.reads]
        end = dma.submit(descs, not_before_ns=ready_ns).end_ns if descs else ready_ns
        results = {name: np.empty_like(views[name]) for name in step.writes}
        step.fn({**host, **results})
        descs = [Descriptor(results[n], views[n], "h2d", n) for n in step.writes]
        end = dma.submit(descs, not_before_ns=end).end_ns if descs else end
        self.device.count("host_fallback_ops")
        return end

    def _download(self, views: dict[str, Any], host_outputs: list[Any],
                  ready_ns: float) -> None:
        srcs, dsts, labels = [], [], []
        for k, src, label in views[_OUTPUT_COPIES]:
            host = host_outputs[k]
            if host is not None and host.size:
                srcs.append(src)
                dsts.append(host)
                labels.append(label)
        if srcs:
            self.device.dma.copy_many("d2h", srcs, dsts, labels, not_before_ns=ready_ns)


#: (output position, strided device view, buffer name) of every tensor output
_OUTPUT_COPIES = "__output_copies__"


def _bind(fn: Callable[..., Any], args: list[Any]) -> Callable[[], Any]:
    """``fn`` launched on ``args`` as a zero-argument call, made once per workspace (the
    views never change while it is cached); a kernel that can pre-convert its arguments
    (a native object: C pointers) does so in its ``bind``."""
    bind = getattr(fn, "bind", None)
    return bind(*args) if bind is not None else functools.partial(fn, *args)
_STEP_ARGS = "__step_args__"
_INPUT_DSTS = "__input_dsts__"
#: step index -> the host data pointers (bytes) its host-mapped launch is bound to
_MAPPED_KEYS = "__mapped_keys__"


def _unbound() -> None:
    raise SimAccelError("a kernel reading a host-mapped input was launched before it was "
                        "bound to the host arrays (please report this)")


def _data_ptr(index: int, host: np.ndarray, data_ptrs: list[int] | None) -> int:
    """Address of argument ``index``'s first element (bytes): the caller's, when it passed
    them (cheap for torch tensors), else numpy's."""
    return data_ptrs[index] if data_ptrs is not None else host.__array_interface__["data"][0]


def _output_view(views: dict[str, Any], out: OutputDecl | None) -> np.ndarray | None:
    """The strided device view a graph output is copied back from."""
    if out is None:
        return None
    base = views[out.buffer]
    item = base.itemsize
    return np.lib.stride_tricks.as_strided(base[out.offset:], out.shape,
                                           [s * item for s in out.strides], writeable=False)


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def _free_resident(resident: dict[str, Any]) -> None:
    """Free the resident blocks (at garbage collection or before a re-upload)."""
    allocator = resident.pop("allocator", None)
    blocks = [resident.pop("block", None), resident.pop("workspace", None),
              *resident.pop("inputs", [])]
    for block in blocks:
        if block is not None and allocator is not None:
            try:
                allocator.free(block)
            except Exception:  # the allocator was replaced by a reconfigure: nothing to free
                pass
    resident.clear()

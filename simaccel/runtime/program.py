"""A compiled graph on the device: a frozen :class:`~simaccel.runtime.spec.ProgramSpec`,
its memory plan, and the per-call executor.

Each call: the program's workspace block (every input, intermediate and output buffer
has a planned offset in it) is taken from the caching allocator at the first call and
kept; inputs are DMA'd host to device as their :class:`~simaccel.runtime.spec.InputPlan`
says (copied, host-mapped: read in place by their one kernel, or resident: uploaded again
only when they changed), lifted scalars go to the resident constant bank (one transfer,
and only when a value changed), kernels run on device buffers, outputs are DMA'd back.
Constants (``get_attr`` tensors) stay resident across calls. Over dynamic shapes the
size symbols' values ride in the constant bank too (its size bank: the same one transfer,
only when a size or a scalar changed), and kernels read their loop bounds from it.

This module knows nothing of torch: buffers are numpy arrays over device memory.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import numpy as np

from simaccel.dma import Descriptor
from simaccel.dma.plan import PlannedPairError
from simaccel.runtime.calls import (CallProgress, call_plan, download_batch, launch_kernels,
                                    run_stepwise)
from simaccel.runtime.constbank import BANK_LABEL, ConstantBank
from simaccel.runtime.device import Device
from simaccel.runtime import tiers
from simaccel.runtime.group import bind_launch
from simaccel.runtime.hostmap import (MAPPED, bind_mapped, bound_to, mapped_steps,
                                      output_array, unbound_mapped_launch)
from simaccel.runtime.memory import Block
from simaccel.runtime.layout import MAX_LAYOUTS, Layouts, SizedLayout, output_view
from simaccel.runtime.replay import record as record_replay
from simaccel.runtime.resident import BoundWorkspace, ResidentState, step_operands
from simaccel.runtime.sizes import size_reader
from simaccel.runtime.spec import (BufferDecl, HostStep, InputPlan, LaunchStep, OutputDecl,
                                   Placement, ProgramSpec, Step)
from simaccel.runtime.staging import (align_up, check_program_alignment, is_aligned,
                                      staging_flags)

__all__ = ["BufferDecl", "HostStep", "InputPlan", "LaunchStep", "OutputDecl", "Placement",
           "Program", "ProgramSpec"]


#: a workspace outgrown by a call is replaced by one this many times what it needs (if
#: there is room): sizes that grew (a KV cache) grow again, and a replacement drops every
#: binding
WORKSPACE_GROWTH = 1.5


class Program:
    """Runs a :class:`ProgramSpec` on a :class:`Device`. Calls are serialised per program
    (its resident constant bank is shared state); different programs run concurrently.
    Memory is planned once, here (over dynamic sizes: at the traced sizes, re-stacked for
    each new size tuple, see :mod:`simaccel.runtime.layout`)."""

    def __init__(self, device: Device, spec: ProgramSpec):
        self.device = device
        self.spec = spec
        check_program_alignment(spec, device)
        self._layouts = Layouts(spec)
        #: the memory plan at the traced sizes
        self.plan = self._layouts.first.plan
        device.count("memory_plans")
        self._symbols = spec.symbols
        #: a call's sizes from its arguments (:func:`~simaccel.runtime.sizes.size_reader`)
        self._read_sizes = size_reader(spec.symbols)
        self._symbol_names = [src.symbol for src in spec.symbols]
        #: general calls on a binding before the next one records its replay: with size
        #: symbols, one (a decode step whose KV cache grows binds a new size tuple every
        #: call, which a replay would never repeat; recording one costs ~50 us)
        self._record_after = 1 if spec.symbols else 0
        self._lock = threading.Lock()
        self._state = ResidentState()
        self._generation = -1
        self._tier_epoch = tiers.current()
        #: bound workspaces by size tuple (one, ``()``, for static shapes)
        self._bound: dict[tuple[int, ...], BoundWorkspace] = {}
        self._bank = ConstantBank([(p.index, p.buffer, np.dtype(p.dtype))
                                   for p in spec.inputs_placed(Placement.BANK)],
                                  len(spec.symbols))
        self._resident_inputs = spec.inputs_placed(Placement.RESIDENT)
        #: resident inputs the program writes in place (an input mutation)
        self._resident_written = tuple(p for p in self._resident_inputs
                                       if p.index in spec.writebacks)
        #: the resident inputs no call changes (a kernel may derive forms of them)
        self._stable = {p.buffer for p in self._resident_inputs if p not in self._resident_written}
        #: inputs moved in every call (copied, mapped, updated in host memory), in order
        self._streamed = spec.inputs_placed(Placement.COPIED, *MAPPED)
        self._streamed_labels = [p.buffer for p in self._streamed]
        mapped = [p.placement in MAPPED for p in self._streamed]
        #: per streamed input: mapped or copied (None: all copied, the engine's fast path)
        self._mapped_flags = mapped if any(mapped) else None
        #: (output position, buffer) of the outputs their kernel writes in host memory
        self._mapped_outputs = tuple((k, out.buffer) for k, out in enumerate(spec.outputs)
                                     if out is not None and out.mapped)
        #: buffer -> dtype of each host-mapped input and output (checked on a new array)
        self._mapped_dtypes = {p.buffer: np.dtype(p.dtype) for p in self._streamed
                               if p.placement in MAPPED}
        self._mapped_dtypes.update((b, np.dtype(spec.buffers[b].dtype))
                                   for _, b in self._mapped_outputs)
        #: the kernels accessing host memory, bound to each call's host arrays
        self._mapped_steps = mapped_steps(spec.steps, self._streamed, spec.outputs)
        self._mapped_indices = [self._streamed[k].index for k in self._mapped_steps.sources]
        #: per streamed input: read or updated in host memory (never staged: no descriptor)
        self._in_place_flags = mapped
        #: the inputs their kernel updates in host memory: (argument index, buffer)
        self._updated = tuple((p.index, p.buffer)
                              for p in spec.inputs_placed(Placement.MAPPED_UPDATE))
        self._kernel_wall_ns = 0
        #: no input write-backs, mapped updates or mapped outputs: the download is the
        #: output copies alone
        self._plain_download = not (spec.writebacks or self._updated or self._mapped_outputs)
        self._host_steps = any(not isinstance(step, LaunchStep) for step in spec.steps)
        self._launches_per_call = sum(step.on_device for step in spec.steps)
        #: position of the first input write-back among the outputs (they come last)
        self._first_writeback = len(spec.outputs) - len(spec.writebacks)
        #: per step: the size bank slot of each size its kernel reads (see LaunchStep)
        self._slots = [tuple(self._symbol_names.index(name) for name in step.size_slots)
                       if isinstance(step, LaunchStep) else () for step in spec.steps]
        self._finalizer = weakref.finalize(self, self._state.free)
        #: this program's calls, launches and kernel wall time, added up by the device
        self._counts = device.call_counts()
        weakref.finalize(self, device.retire_call_counts, self._counts)
        device.register_program(self)

    @property
    def host_mapped(self) -> dict[int, str]:
        """The inputs (argument index -> buffer) a kernel reads or updates in host memory."""
        return {p.index: p.buffer for p in self._streamed if p.placement in MAPPED}

    @property
    def mapped_updates(self) -> frozenset[int]:
        """Argument indices of the inputs their kernel updates in host memory (no write-back)."""
        return frozenset(index for index, _ in self._updated)

    def layout_for(self, args: list[Any]) -> SizedLayout:
        """The layout of a call on ``args``: its sizes read from the arguments symbols name."""
        if not self._symbols:
            return self._layouts.first
        return self._layouts.at(self._read_sizes(args))

    def plan_at(self, sizes: tuple[int, ...]):
        """The memory plan a call at these sizes (the symbols' values) uses."""
        return self._layouts.at(sizes).plan

    def traced_bytes(self, buffer: str) -> int:
        """Bytes of ``buffer`` at the traced sizes."""
        return self._layouts.first.numel[buffer] * self.spec.buffers[buffer].itemsize

    @property
    def bank_inputs(self) -> frozenset[int]:
        """Argument indices of the scalars packed into the constant bank."""
        return frozenset(p.index for p in self.spec.inputs_placed(Placement.BANK))

    @property
    def resident_written(self) -> tuple[int, ...]:
        """Argument indices of the resident inputs the program writes in place."""
        return tuple(p.index for p in self._resident_written)

    @property
    def resident_inputs(self) -> frozenset[int]:
        """Argument indices of the inputs kept resident on the device."""
        return frozenset(p.index for p in self._resident_inputs)

    # ------------------------------------------------------------------ resident state

    def _ensure_resident(self) -> None:
        """Upload constants and create the constant bank (again after a reconfigure)."""
        device = self.device
        check_program_alignment(self.spec, device)
        self._state.free()
        self._bound.clear()
        state = self._state
        constants = self.spec.constants
        nbytes = sum(self.spec.buffers[n].nbytes for n in constants)
        nbytes += self._bank.nbytes + device.config.alignment * (len(constants) + 1)
        state.allocator = device.allocator
        state.block = device.allocator.malloc(nbytes)
        offset = state.block.offset
        descs = []
        for name, host in constants.items():
            decl = self.spec.buffers[name]
            view = device.memory.view(offset, np.dtype(decl.dtype), decl.numel)
            state.views[name] = view
            descs.append(Descriptor(np.ascontiguousarray(host).reshape(-1), view, "h2d", name))
            offset = align_up(offset + decl.nbytes, device.config.alignment)
        state.bank = device.memory.view(offset, np.dtype(np.uint8), self._bank.nbytes)
        state.size_bank = self._bank.size_view(state.bank)
        self._bank.valid = False
        if descs:
            device.dma.submit(descs)
            device.count("resident_uploads", len(descs))
            device.count("resident_bytes", sum(d.nbytes for d in descs))
        self._generation = device.generation

    # ------------------------------------------------------------------ per call

    def run(self, args: list[Any], host_outputs: list[np.ndarray | None],
            resident_keys: dict[int, Any] | None = None,
            data_ptrs: list[int] | None = None, layout: SizedLayout | None = None,
            after_keys: dict[int, Any] | None = None) -> None:
        """Execute once: ``args`` are host arrays / Python scalars by argument index;
        each tensor output is copied into ``host_outputs[k]``. ``resident_keys`` identify
        the current contents of resident inputs (same key: no upload). ``data_ptrs``: the
        address of each tensor argument's first element (bytes), where the caller knows it
        cheaply; read from the arrays otherwise. ``layout``: :meth:`layout_for` of ``args``
        when the caller has it already. ``after_keys``: the keys the resident inputs the
        program writes in place will have at the next call (their device copy holds the
        value written back); a failed call forgets them, so they upload again."""
        device = self.device
        layout = layout or self.layout_for(args)
        with self._lock:
            if self._generation != device.generation:
                self._ensure_resident()
            ready = (self._upload_resident(args, resident_keys, layout)
                     if self._resident_inputs else 0.0)
            if self._tier_epoch != tiers.current():  # a kernel's compiled form arrived
                self._bound.clear()
                self._tier_epoch = tiers.current()
            try:
                bound = self._bind_workspace(self._workspace(layout.plan.total_bytes), layout)
                replay = bound.replay
                replayed = bool(replay) and replay.accepts(args, host_outputs, data_ptrs)
                if replayed:
                    self._kernel_wall_ns = replay.run(args, host_outputs, data_ptrs,
                                                      layout.sizes, ready)
                else:
                    done = self._execute(bound, args, host_outputs, data_ptrs, layout.sizes,
                                         ready)
                    bound.general_calls += 1
                    if replay is None and bound.general_calls > self._record_after:
                        bound.replay = record_replay(bound, done, self, args, host_outputs)
            except BaseException:
                for plan in self._resident_written:
                    self._state.set_key(plan.buffer, None)
                raise
            if after_keys:
                for plan in self._resident_written:
                    self._state.set_key(plan.buffer, after_keys.get(plan.index))
            counts = self._counts  # under the program's lock: no device lock per call
            counts.calls += 1
            counts.replayed_calls += replayed
            counts.kernel_launches += self._launches_per_call
            counts.kernel_wall_ns += self._kernel_wall_ns

    def _workspace(self, nbytes: int) -> Block:
        """The program's workspace block (planned offsets of every per-call buffer), at
        least ``nbytes`` large.

        Like an XLA executable's temp buffer it is allocated at the first call and kept
        until the program is garbage collected (a call at larger sizes swaps it for a
        larger one); under memory pressure the device asks idle programs to give theirs
        back before it reports out-of-memory."""
        block = self._state.workspace
        grown = None
        if block is not None and block.size < nbytes:
            grown = int(nbytes * WORKSPACE_GROWTH)
            self._state.allocator.free(block)
            self._state.workspace = block = None
            self._bound.clear()
        if block is None:
            # One OOM is counted only if the request fails after idle programs gave back
            # their workspaces, as PyTorch counts one per OOM raised to the user.
            allocator = self.device.allocator
            block = (grown and allocator.try_malloc(grown)) or allocator.try_malloc(nbytes)
            if block is None:
                self.device.release_idle_workspaces(keep=self)
                block = allocator.malloc(nbytes)
            self._state.workspace = block
        return block

    def release_workspace(self) -> int:
        """Free the workspace if no call is running; returns the bytes released."""
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            block, self._state.workspace = self._state.workspace, None
            if block is None:
                return 0
            self._state.allocator.free(block)
            self._bound.clear()  # and, memory being short, the derived operands
            return block.size + self._state.release_derived()
        finally:
            self._lock.release()

    def unload(self) -> int:
        """Free everything the program keeps on the device (constants, constant bank,
        resident inputs, workspace); the next call uploads it again, as after a
        reconfigure. Returns the bytes freed; 0 if a call is running (nothing freed)."""
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            freed = self._state.free()
            self._bound.clear()
            self._generation = -1
            return freed
        finally:
            self._lock.release()

    def _bind_workspace(self, block: Block, layout: SizedLayout) -> BoundWorkspace:
        """Views of every buffer in ``block`` and the launches bound to them (once per
        block and size tuple; a kernel on host-mapped memory is bound per call, later)."""
        bound = self._bound.get(layout.key)
        if bound is not None and bound.offset == block.offset:
            return bound
        memory, numel = self.device.memory, layout.numel
        fixed_views, fixed_addresses = self._state.fixed_views(self._bank)
        views: dict[str, np.ndarray] = dict(fixed_views)
        # workspace addresses from the offsets (numpy reads one back in ~2 us a view)
        base = memory.address + block.offset
        addresses: dict[str, int] = dict(fixed_addresses)
        for name, off in layout.plan.offsets.items():
            decl = self.spec.buffers[name]
            views[name] = memory.view(block.offset + off, np.dtype(decl.dtype), numel[name])
            addresses[name] = base + off
        mapped = {step.index for step in self._mapped_steps}
        launches = [unbound_mapped_launch if k in mapped else bind_launch(
            step.fn, self._launch_args(k, [views[b] for b in step.buffers], layout),
            [addresses.get(b) for b in step.buffers],
            step_operands(self._state, step, self._stable, self.device.count))
            if isinstance(step, LaunchStep) else None for k, step in enumerate(self.spec.steps)]
        updated = {buffer for _, buffer in self._updated}  # written in host memory
        outputs = [(k, output_view(views[out.buffer], *layout.outputs[k]), out.buffer)
                   for k, out in enumerate(self.spec.outputs)
                   if out is not None and out.buffer not in updated and not out.mapped]
        durations = [self.device.kernel_time_ns(*cost) if isinstance(step, LaunchStep) else 0.0
                     for step, cost in zip(self.spec.steps, layout.costs)]
        bound = BoundWorkspace(block.offset, views, outputs,
                               [views.get(p.buffer) for p in self._streamed], launches,
                               durations, layout)
        bound.mapped_dtypes, bound.addresses = self._mapped_dtypes, addresses
        if len(self._bound) >= MAX_LAYOUTS:
            self._bound.pop(next(iter(self._bound)))  # the oldest size tuple's
        self._bound[layout.key] = bound
        return bound

    def _launch_args(self, k: int, arrays: list[np.ndarray], layout: SizedLayout) -> list:
        """Step ``k``'s kernel arguments: its arrays, parameters at these sizes, size slots."""
        return [*arrays, *layout.params[k], *self._slots[k]]

    def _execute(self, bound: BoundWorkspace, args: list[Any], host_outputs: list[Any],
                 data_ptrs: list[int] | None, sizes: tuple[int, ...], ready_ns: float
                 ) -> CallProgress:
        """Move the call's inputs, run its steps, move its outputs, then put the call on
        the device timeline as one record (:mod:`simaccel.runtime.calls`); kernels start
        no earlier than ``ready_ns`` (the resident uploads). A program with host steps
        records its uploads, runs its steps one by one, then records its download.
        Returns what the call did (the plans a replay of it places)."""
        dma, done = self.device.dma, CallProgress()
        try:
            if self._mapped_steps:
                self._bind_mapped(bound, args, host_outputs, data_ptrs)
            self._upload(bound, args, data_ptrs, sizes, done)
            if self._host_steps:
                ready_ns = dma.record_call(call_plan(dma, bound, self.spec.steps, done),
                                           ready_ns=ready_ns)
                done = CallProgress()
                ready_ns, self._kernel_wall_ns = run_stepwise(
                    self.device, self.spec.steps, bound, ready_ns,
                    dict(zip(self._symbol_names, sizes)))
            else:
                self._kernel_wall_ns = launch_kernels(bound, self.device.compute_lock, done)
            self._download(bound, args, host_outputs, data_ptrs, done)
        except BaseException as exc:  # record what moved and ran, then say why it stopped
            end = ready_ns
            if done.uploads or done.download or done.launched:
                end = dma.record_call(call_plan(dma, bound, self.spec.steps, done),
                                      ready_ns=ready_ns)
            if not isinstance(exc, PlannedPairError):
                raise
            dma.place_moved(done.moving, exc.done, end if done.moving.kind == "d2h" else 0.0)
            raise exc.cause from None
        dma.record_call(call_plan(dma, bound, self.spec.steps, done), ready_ns=ready_ns)
        return done

    def _upload(self, bound: BoundWorkspace, args: list[Any], data_ptrs: list[int] | None,
                sizes: tuple[int, ...], done: CallProgress) -> None:
        """DMA the per-call tensor inputs (one scatter-gather batch) and, if a lifted
        scalar or a size symbol (``sizes``: this call's) changed, the constant bank (one
        descriptor); ``done`` gets their plans."""
        if self._streamed:
            srcs = [args[p.index] for p in self._streamed]
            staged, empty = staging_flags(self._streamed, srcs, self._in_place_flags,
                                          data_ptrs, self.spec.alignment)
            if empty:  # an empty input has nothing to address
                dsts = [d if h.size or d is None else d[:0]
                        for d, h in zip(bound.input_dsts, srcs)]
            else:
                dsts = bound.dsts_shaped_like(srcs)
            # mapped inputs ride in the same batch: one h2d transfer per call
            self._copy_planned(bound, staged, "h2d", srcs, dsts, self._streamed_labels,
                               staged, self._mapped_flags, done)
        if self._bank.used and self._bank.pack(args, sizes):
            # planned like the inputs: a changed scalar costs one planned batch
            self._copy_planned(bound, "const", "const", [self._bank.host], [self._state.bank],
                               [BANK_LABEL], None, None, done)

    def _bind_mapped(self, bound: BoundWorkspace, args: list[Any], host_outputs: list[Any],
                     data_ptrs: list[int] | None) -> None:
        """Bind the launches on host memory to this call's arrays (:func:`.bind_mapped`)."""
        if bound_to(bound, list(map(args.__getitem__, self._mapped_indices))):
            return  # kept views: the very arrays every mapped launch is bound to

        def bind(k: int, hosts: dict[str, np.ndarray], host_addresses: dict[str, int]) -> None:
            step = self.spec.steps[k]
            bound.launches[k] = bind_launch(step.fn, self._launch_args(
                k, [hosts[b] if b in hosts else bound.views[b] for b in step.buffers],
                bound.layout), [host_addresses.get(b) or bound.addresses.get(b)
                                for b in step.buffers],  # a resident weight: as unmapped
                step_operands(self._state, step, self._stable, self.device.count))
        bind_mapped(bound, [args[p.index] for p in self._streamed], host_outputs, data_ptrs,
                    self._streamed, self._mapped_steps, bind)

    def _upload_resident(self, args: list[Any], keys: dict[int, Any] | None,
                         layout: SizedLayout) -> float:
        """Upload resident inputs whose key changed (first call, in-place update, new
        tensor); one scatter-gather submit for all of them. Their alignment is checked
        here, at each upload, not per call."""
        srcs, dsts, labels, staged = [], [], [], []
        for plan in self._state.changed(self._resident_inputs, keys or {}):
            host = args[plan.index]
            srcs.append(host)
            dsts.append(self._resident_view(plan.buffer, layout.numel[plan.buffer]))
            labels.append(plan.buffer)
            staged.append(not is_aligned(plan, host, None, self.spec.alignment))
        if not srcs:
            return 0.0
        self.device.count("resident_uploads", len(srcs))
        self.device.count("resident_bytes", sum(d.nbytes for d in dsts))
        return self.device.dma.copy_many("h2d", srcs, dsts, labels, staged=staged)

    def _resident_view(self, name: str, numel: int) -> np.ndarray:
        """The device view of resident input ``name`` (a block of its own, allocated at
        the first upload, and again when a dynamic size outgrows it)."""
        views = self._state.views
        view = views.get(name)
        if view is None or view.size != numel:
            decl = self.spec.buffers[name]
            old = self._state.input_blocks.pop(name, None)
            if old is not None:  # a dynamic size changed: the old size's block goes back
                self.device.allocator.free(old)
            block = self.device.allocator.malloc(numel * decl.itemsize)
            self._state.input_blocks[name] = block
            views[name] = view = self.device.memory.view(block.offset, np.dtype(decl.dtype),
                                                         numel)
            self._bound.clear()
        return view

    def _download(self, bound: BoundWorkspace, args: list[Any], host_outputs: list[Any],
                  data_ptrs: list[int] | None, done: CallProgress) -> None:
        """DMA every tensor output (and input write-back) device to host in one submit;
        a write-back goes into the caller's tensor, staged when its address is not
        aligned (the outputs simaccel allocates always are). The inputs a kernel updated
        in host memory (``args``: the call's host arrays) ride in the same submit as
        mapped writes (nothing to copy), as do the outputs a kernel wrote in the caller's
        memory. ``data_ptrs``: as for :meth:`run` (0: address not known)."""
        if self._plain_download:  # outputs only, all the caller's: one fixed batch
            dsts = [host_outputs[k] for k in bound.output_positions]
            if all(host is not None and host.size for host in dsts):
                self._copy_planned(bound, "d2h", "d2h", bound.output_srcs, dsts,
                                   bound.output_labels, None, None, done)
                return
        written = [(args[index], buffer) for index, buffer in self._updated]
        written += [(output_array(bound, host_outputs[k], buffer), buffer)
                    for k, buffer in self._mapped_outputs]
        srcs, dsts, labels, staged, mapped = download_batch(
            bound.output_copies, host_outputs, self.spec.writebacks, self._first_writeback,
            data_ptrs, self.spec.alignment, written)
        if srcs:
            staged_or_none = staged if True in staged else None
            self._copy_planned(bound, ("d2h", tuple(labels), staged_or_none and tuple(staged)),
                               "d2h", srcs, dsts, labels, staged_or_none, mapped, done)

    def _copy_planned(self, bound: BoundWorkspace, key: Any, kind: str, srcs: list[np.ndarray],
                      dsts: list[np.ndarray | None], labels: list[str],
                      staged: Any, mapped: list[bool] | None, done: CallProgress) -> None:
        """Move one DMA batch of a call through its plan, made at the first call of this
        workspace with this ``key`` (what varies between its calls: labels and staging;
        the sizes are the layout's, the mapped flags the program's); ``done`` gets the
        plan (the call is placed at its end)."""
        plan = bound.batch_plans.get(key)
        dma = self.device.dma
        if plan is None:
            plan = bound.batch_plans[key] = dma.plan_batch(kind, srcs, dsts, labels,
                                                           staged=staged, mapped=mapped)
        done.moving = plan
        try:  # the mapped arrays were checked when their kernel was bound (_bind_mapped)
            dma.move_batch(plan, srcs, dsts, mapped_checked=mapped is not None)
        except PlannedPairError:
            bound.batch_plans.pop(key, None)  # it may have been made from the bad pair
            raise
        if kind == "d2h":
            done.download = plan
        else:
            done.uploads.append(plan)


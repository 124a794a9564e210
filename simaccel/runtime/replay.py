"""Replayed calls: a program's common call, recorded once per workspace binding.

The general call (:meth:`~simaccel.runtime.program.Program._execute`) works out per call
what the plans of its binding already fix: which inputs are staged, which batch plans
and which call plan apply, where each copy goes. Once a call on a binding has gone that
way with nothing staged and no host step, the runtime records it as a :class:`Replay`,
as a CUDA graph records a stream's work once and launches it again: the copies to make
(source argument, device destination), the launches, the batch and call plans. A
replayed call moves the same bytes, runs the same kernels and lands on the timeline,
trace and counters exactly as the general call would, because it places the very plans
the general call made (``tests/runtime/test_replay.py`` checks both ways give equal
results, timelines and counters).

A replay applies to a call whose arrays match the recorded ones (shape and dtype of every
copied input and output, every copy's address aligned for a direct descriptor); it checks
that before anything moves and otherwise leaves the call to the general path, which
stages, reshapes or raises as it always does. That check is the whole per-call cost of
deciding, which is why a replay is ~2x cheaper than the general call on a small graph.
"""
from __future__ import annotations

import operator
import time
from typing import Any, Callable

import numpy as np

from simaccel.runtime.calls import CallProgress, call_plan
from simaccel.runtime.constbank import BANK_LABEL
from simaccel.runtime.hostmap import data_ptr
from simaccel.runtime.resident import BoundWorkspace
from simaccel.runtime.sequence import LaunchSequence
from simaccel.runtime.spec import Placement


#: the largest input array (bytes) :meth:`Replay.accepts` remembers between calls: the
#: host views simaccel keeps between calls anyway (``simaccel.host_args``)
REMEMBER_MAX_BYTES = 64 << 10


class Replay:
    """One binding's recorded call (see the module doc); built by :func:`record`."""

    __slots__ = ("bound", "inputs", "outputs", "mapped_reads", "checked", "accepted",
                 "bind_mapped", "bank", "bank_dst", "calls", "steps", "alignment", "dma",
                 "compute_lock")

    def __init__(self, bound: BoundWorkspace, program: Any, inputs: list[tuple],
                 outputs: list[tuple], calls: dict[bool, Any]):
        self.bound = bound
        #: (argument index, device destination, shape, dtype) of each copied input
        self.inputs = inputs
        #: (output position, device source, shape, dtype, argument index of an input
        #: write-back or None) of each output copy
        self.outputs = outputs
        #: argument indices of the inputs a kernel reads in host memory (at any address)
        self.mapped_reads = [p.index for p in program._streamed
                             if p.placement is Placement.MAPPED]
        #: argument indices of every input :meth:`accepts` checks when all are small
        #: (None otherwise: a mapped input is large), and their host arrays at the last
        #: call it accepted: the same array objects again pass unchecked (a numpy array
        #: keeps its shape, dtype and address); small, so that remembering them holds no
        #: caller's large tensor alive. An accepted array has its recorded size.
        small = not self.mapped_reads and all(
            int(np.prod(shape)) * dtype.itemsize <= REMEMBER_MAX_BYTES
            for _, _, shape, dtype in inputs)
        self.checked = [index for index, _, _, _ in inputs] if small else None
        self.accepted: list[Any] | None = None
        #: binds the launches accessing host memory (mapped inputs and outputs) to this
        #: call's arrays; None when no kernel does
        self.bind_mapped = program._bind_mapped if program._mapped_steps else None
        self.bank = program._bank if program._bank.used else None
        self.bank_dst = program._state.bank
        #: the call plan without and with a constant-bank upload
        self.calls = calls
        self.steps = program.spec.steps
        self.alignment = program.spec.alignment
        self.dma = program.device.dma
        self.compute_lock = program.device.compute_lock

    def accepts(self, args: list[Any], host_outputs: list[Any],
                data_ptrs: list[int] | None) -> bool:
        """Whether this call's arrays match the record: every copied input and output
        of the recorded shape and dtype at an aligned address, every output writeable
        (checked before anything moves; a call that does not match goes the general
        way)."""
        if not self.accepts_inputs(args, data_ptrs):
            return False
        alignment = self.alignment
        for position, _, shape, dtype, index in self.outputs:
            dst = host_outputs[position]
            if type(dst) is not np.ndarray or dst.shape != shape or dst.dtype != dtype \
                    or not dst.flags.writeable:
                return False
            if index is not None and data_ptr(index, dst, data_ptrs) % alignment:
                return False  # an input write-back into a misaligned tensor: staged
        return True

    def accepts_inputs(self, args: list[Any], data_ptrs: list[int] | None) -> bool:
        """:meth:`accepts` for the inputs alone (a caller making its outputs from the
        device views, :class:`~simaccel.runtime.direct.DirectReplay`, has none to check)."""
        if self.checked is None:
            return self._inputs_match(args, data_ptrs)
        checked = list(map(args.__getitem__, self.checked))
        if self.accepted is None or not all(map(operator.is_, checked, self.accepted)):
            self.accepted = None
            if not self._inputs_match(args, data_ptrs):
                return False
            self.accepted = checked
        return True

    def _inputs_match(self, args: list[Any], data_ptrs: list[int] | None) -> bool:
        """Every copied input of the recorded shape and dtype at an aligned address (a
        mapped input is read in place at any address)."""
        alignment = self.alignment
        for index, _, shape, dtype in self.inputs:
            src = args[index]
            if type(src) is not np.ndarray or src.shape != shape or src.dtype != dtype \
                    or data_ptr(index, src, data_ptrs) % alignment:
                return False
        return True

    def run(self, args: list[Any], host_outputs: list[Any], data_ptrs: list[int] | None,
            sizes: tuple[int, ...], ready_ns: float,
            download: Callable[[list[Any]], None] | None = None) -> int:
        """Replay the call on ``args`` (host arrays, Python numbers; :meth:`accepts` said
        yes) into ``host_outputs``; the kernels start no earlier than ``ready_ns``.
        ``download(host_outputs)`` copies the outputs out of the device views (default:
        into the host arrays there; a caller making new outputs from the views puts them
        there instead). Returns the kernels' host wall time (ns). A kernel that raises
        stops the call: what moved and ran is placed, as the general call does, and the
        error goes on."""
        if self.bind_mapped is not None:
            self.bind_mapped(self.bound, args, host_outputs, data_ptrs)
        return self.run_bound(args, host_outputs, sizes, ready_ns, download)

    def run_bound(self, args: list[Any], host_outputs: list[Any], sizes: tuple[int, ...],
                  ready_ns: float, download: Callable[[list[Any]], None] | None = None,
                  upload: Callable[[list[Any]], None] | None = None) -> int:
        """:meth:`run` once the launches on host memory are bound to this call's arrays
        (an :class:`~simaccel.runtime.address.AddressReplay` points them itself, and
        copies the inputs in by ``upload(args)``)."""
        bound = self.bound
        (upload or self._upload)(args)
        bank = self.bank
        packed = False
        sequence = bound.sequence
        if sequence is None:
            sequence = bound.sequence = LaunchSequence(bound.launches)
        sequence.launched = 0
        wall = None
        try:
            packed = bank is not None and bank.pack(args, sizes)  # raises on overflow
            if packed:
                self.bank_dst[...] = bank.host
            with self.compute_lock:
                start = time.perf_counter_ns()
                sequence()
                wall = time.perf_counter_ns() - start
            (download or self._download)(host_outputs)
        except BaseException:
            # every launch ran when the download failed (only an error outside simaccel
            # can stop that)
            launched = sequence.launched if wall is None else len(bound.launches)
            self._record_partial(packed, launched, ready_ns)
            raise
        self.dma.record_call_later(self.calls[packed], ready_ns=ready_ns)
        return wall

    def _upload(self, args: list[Any]) -> None:
        """Copy every copied input into its device view (shapes and dtypes equal:
        accepts)."""
        for index, dst, _, _ in self.inputs:
            dst[...] = args[index]

    def _download(self, host_outputs: list[Any]) -> None:
        """Copy every output into its host array (shapes and dtypes equal: accepts)."""
        for position, src, _, _, _ in self.outputs:
            host_outputs[position][...] = src

    def _record_partial(self, packed: bool, launched: int, ready_ns: float) -> None:
        """Place what a call stopped by a scalar its bank slot cannot hold, a kernel (or,
        past :meth:`accepts`, its download: only an error outside simaccel can stop
        that) moved and ran, as the general call places it."""
        done = CallProgress()
        done.uploads = list(self.calls[packed].uploads)
        done.launched = launched
        self.dma.record_call(call_plan(self.dma, self.bound, self.steps, done),
                             ready_ns=ready_ns)


def record(bound: BoundWorkspace, done: CallProgress, program: Any, args: list[Any],
           host_outputs: list[Any]) -> Replay | bool | None:
    """The replay of the general call that just succeeded on ``bound`` (``done``: what
    it moved and ran; ``args`` and ``host_outputs``: that call's); False when no call of
    the program can be replayed (it has host steps); None when this call is not one a
    replay repeats (a staged copy, an empty input or output, an output left out): a
    later call on the binding may be."""
    if program._host_steps:
        return False
    if any(True in plan.staged for plan in done.uploads) \
            or done.download is not None and True in done.download.staged:
        return None
    inputs = _recorded_inputs(bound, program, args)
    outputs = _recorded_outputs(bound, program, host_outputs)
    if inputs is None or outputs is None or (outputs and done.download is None):
        return None
    # the call's input batch (nothing staged: the one every replay moves), and the
    # constant bank's, which a replay moves when a scalar changed
    inputs_moved = [plan for plan in done.uploads if plan.kind != "const"]
    bank_plan = bound.batch_plans.get("const")
    if program._bank.used and bank_plan is None:
        # no call on this binding moved the bank: one made after a kernel switched tiers
        # (or the workspace grew) while every scalar kept its value; plan it as the
        # upload would, or no call of the binding would ever replay
        bank_plan = bound.batch_plans["const"] = program.device.dma.plan_batch(
            "const", [program._bank.host], [program._state.bank], [BANK_LABEL])
    calls = {}
    for packed, uploads in ((False, inputs_moved), (True, [*inputs_moved, bank_plan])):
        if packed and bank_plan is None:
            continue
        progress = CallProgress()
        progress.uploads, progress.download = uploads, done.download
        progress.launched = len(bound.launches)
        calls[packed] = call_plan(program.device.dma, bound, program.spec.steps, progress)
    return Replay(bound, program, inputs, outputs, calls)


def _recorded_inputs(bound: BoundWorkspace, program: Any, args: list[Any]
                     ) -> list[tuple] | None:
    """:attr:`Replay.inputs` from the recorded call's ``args`` (None if one is empty or
    not an array: the general path handles those)."""
    dsts = bound.shaped_dsts
    inputs = []
    for k, plan in enumerate(program._streamed):
        if plan.placement is not Placement.COPIED:
            continue
        src = args[plan.index]
        if not isinstance(src, np.ndarray) or not src.size or dsts is None \
                or dsts[k] is None or dsts[k].shape != src.shape:
            return None
        inputs.append((plan.index, dsts[k], src.shape, src.dtype))
    return inputs


def _recorded_outputs(bound: BoundWorkspace, program: Any, host_outputs: list[Any]
                      ) -> list[tuple] | None:
    """:attr:`Replay.outputs` from the recorded call's ``host_outputs`` (None unless
    every output copy had a non-empty host array of its device view's shape)."""
    writebacks, first = program.spec.writebacks, program._first_writeback
    outputs = []
    for k, src, _ in bound.output_copies:
        host = host_outputs[k]
        if not isinstance(host, np.ndarray) or not host.size or host.shape != src.shape \
                or host.dtype != src.dtype:
            return None
        outputs.append((k, src, host.shape, host.dtype,
                        writebacks[k - first] if k >= first else None))
    return outputs

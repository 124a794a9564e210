"""How a program call runs its steps and lands on the device timeline.

A call moves its input batches, runs its kernels and moves its outputs; the DMA engine
then places the whole call at once (:meth:`~simaccel.dma.engine.DmaEngine.record_call`:
one timeline record, one trace entry, one count), from a
:class:`~simaccel.dma.call.CallPlan` made once per workspace binding. A program with host
steps (fallback ops) runs them one by one instead, each placed as it runs: a host step
waits for its operands' device-to-host copies. A call that fails part way records what it
did (the batches that moved, the kernels that ran), so the timeline and counters match
the bytes that really moved.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from simaccel.dma import Descriptor
from simaccel.dma.call import CallPlan
from simaccel.runtime.hostmap import data_ptr
from simaccel.runtime.resident import BoundWorkspace
from simaccel.runtime.spec import Step


class CallProgress:
    """What one call has done so far: the DMA batch plans whose bytes moved (``uploads``,
    ``download``), the batch being moved (``moving``), the kernels launched."""

    __slots__ = ("uploads", "download", "moving", "launched")

    def __init__(self) -> None:
        self.uploads: list[Any] = []
        self.download: Any = None
        self.moving: Any = None
        self.launched = 0


def call_plan(dma: Any, bound: BoundWorkspace, steps: list[Step], done: CallProgress
              ) -> CallPlan:
    """The call plan of what ``done`` did on ``bound``, made once per binding and set of
    batch plans (the batch plans live as long as the binding, so their ids are stable
    keys)."""
    key = (*[id(p) for p in done.uploads], id(done.download), done.launched)
    found = bound.call_plans.get(key)
    if found is None:
        kernels = [k for k, launch in enumerate(bound.launches) if launch is not None]
        kernels = kernels[:done.launched]
        found = bound.call_plans[key] = dma.plan_call(
            done.uploads, [steps[k].name for k in kernels],
            [bound.durations[k] for k in kernels], done.download)
    return found


def launch_kernels(bound: BoundWorkspace, compute_lock: Any, done: CallProgress) -> int:
    """Run every launch of a program without host steps, holding the device's compute
    lock once for all of them; returns their host wall time (ns). ``done.launched``
    counts the launches that returned, also when one raises."""
    launched = 0
    try:
        with compute_lock:
            start = time.perf_counter_ns()
            for launch in bound.launches:
                launch()
                launched += 1
            return time.perf_counter_ns() - start
    finally:
        done.launched = launched


def run_stepwise(device: Any, steps: list[Step], bound: BoundWorkspace, ready_ns: float,
                 sizes: dict[str, int]) -> tuple[float, int]:
    """Run a program's steps one by one after ``ready_ns``, each placed on the timeline
    as it runs (a program with host steps); ``sizes``: this call's size symbols (a host
    step may read any of them). Returns (when the last is done in ns, the kernels' host
    wall time in ns)."""
    schedule = device.dma.schedule_compute
    clock = time.perf_counter_ns
    end = ready_ns
    wall = 0
    for step, launch, duration in zip(steps, bound.launches, bound.durations):
        if launch is not None:
            with device.compute_lock:
                t0 = clock()
                launch()
                wall += clock() - t0
            end = schedule(step.name, duration, end)[1]
        else:
            end = _run_host(device, step, bound.views, end, sizes)
    return end, wall


def _run_host(device: Any, step: Step, views: dict[str, np.ndarray], ready_ns: float,
              sizes: dict[str, int]) -> float:
    """A fallback op: its operands go device->host and its results host->device."""
    dma = device.dma
    host = {name: np.empty_like(views[name]) for name in step.reads}
    descs = [Descriptor(views[n], host[n], "d2h", n) for n in step.reads]
    end = dma.submit(descs, not_before_ns=ready_ns).end_ns if descs else ready_ns
    results = {name: np.empty_like(views[name]) for name in step.writes}
    step.fn({**host, **results}, sizes)
    descs = [Descriptor(results[n], views[n], "h2d", n) for n in step.writes]
    end = dma.submit(descs, not_before_ns=end).end_ns if descs else end
    device.count("host_fallback_ops")
    return end


def download_batch(copies: list[tuple[int, np.ndarray, str]], host_outputs: list[Any],
                   writebacks: tuple[int, ...], first_writeback: int,
                   data_ptrs: list[int] | None, alignment: int,
                   written: list[tuple[np.ndarray, str]]) -> tuple[list, list, list, list, Any]:
    """(srcs, dsts, labels, staging flags, mapped flags or None) of a call's d2h batch:
    each output copy (``copies``: (position, device view, buffer)) into its non-empty
    host array, an input write-back (positions from ``first_writeback`` on, argument
    indices ``writebacks``) staged when its caller's address is not ``alignment``
    aligned (``data_ptrs``: known addresses, else 0); then ``written``, the (host array,
    buffer) of each input update and output a kernel wrote in host memory: mapped
    writes, nothing to copy."""
    srcs, dsts, labels, staged = [], [], [], []
    for k, src, label in copies:
        host = host_outputs[k]
        if host is not None and host.size:
            srcs.append(src)
            dsts.append(host)
            labels.append(label)
            if writebacks:
                index = writebacks[k - first_writeback] if k >= first_writeback else None
                staged.append(index is not None
                              and data_ptr(index, host, data_ptrs) % alignment != 0)
    if not written:
        return srcs, dsts, labels, staged, None
    mapped = [False] * len(srcs) + [True] * len(written)
    for host, buffer in written:
        srcs.append(host)
        dsts.append(None)
        labels.append(buffer)
    return srcs, dsts, labels, staged + [False] * len(written) if staged else [], mapped

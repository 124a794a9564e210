"""Batch plans: a scatter-gather list a program submits on every call, worked out once.

A compiled program moves the same pairs every call (its inputs in, its outputs out): the
same labels, byte counts, staging and mapped flags, only the host arrays differ. A
:class:`BatchPlan` holds everything about such a batch that does not depend on the call:
each descriptor's duration (``latency_ns + nbytes / bandwidth``) and bursts, its trace
name and args, the batch's counter totals, and, for each channel the round-robin deal can
start on, which channel every descriptor lands on and what each channel's share adds up
to. Placing a planned batch is then one step per channel instead of one per descriptor,
and its trace entry is one small tuple (:data:`simaccel.dma.trace.PlannedBatch`): the
simulated timeline, stats and trace are exactly those of the same pairs given to
:meth:`~simaccel.dma.engine.DmaEngine.copy_many`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simaccel.dma.copy import check_mappable, copy_array, mapped_bytes


@dataclass(frozen=True)
class ChannelDeal:
    """Where a batch's descriptors land when the deal starts on one channel.

    tids: each descriptor's channel, in order; offsets: when each starts after its
    channel's share starts (ns: the durations before it on that channel); active: the
    channels that get at least one, with the total duration of their share (ns), in
    channel order; last: the channel of the last descriptor."""

    tids: tuple[int, ...]
    offsets: tuple[float, ...]
    active: tuple[tuple[int, float], ...]
    last: int


@dataclass(frozen=True)
class BatchPlan:
    """One batch's call-independent facts (see the module doc); made by
    :meth:`~simaccel.dma.engine.DmaEngine.plan_batch` for that engine's timing.

    ``nbytes``/``durations``/``bursts``: per descriptor (bytes, ns, count); ``staged`` and
    ``mapped``: per descriptor flags (mapped: an h2d read or d2h write in place, nothing copied);
    ``names``/``args``: the trace's per-span name and compact args; ``timing``: the
    engine's (channels, latency_ns, bandwidth_gbps, burst_bytes) the plan was made for."""

    kind: str
    labels: tuple[str, ...]
    nbytes: tuple[int, ...]
    staged: tuple[bool, ...]
    mapped: tuple[bool, ...]
    durations: tuple[float, ...]
    bursts: tuple[int, ...]
    names: tuple[str, ...]
    #: per descriptor: None, or a strided source's (shape, strides) (trace args)
    strided: tuple[Any, ...]
    timing: tuple[int, float, float, int]
    #: (bytes, bursts, staged bytes, mapped bytes, mapped accesses) of the whole batch
    totals: tuple[int, int, int, int, int]
    #: positions of the pairs that are copied (not mapped), in order
    copied: tuple[int, ...] = ()
    #: True if some pair is staged or mapped (the plain copy loop does neither)
    special: bool = False
    #: trace args per start channel (they name the channel)
    _args: dict[int, tuple] = field(default_factory=dict, compare=False, repr=False)
    _deals: dict[int, ChannelDeal] = field(default_factory=dict, compare=False, repr=False)

    def deal(self, first: int) -> ChannelDeal:
        """The round-robin deal starting on channel ``first`` (made once per channel)."""
        found = self._deals.get(first)
        if found is None:
            channels = self.timing[0]
            tids = tuple((first + i) % channels for i in range(len(self.durations)))
            totals: dict[int, float] = {}
            offsets = []
            for tid, duration in zip(tids, self.durations):
                before = totals.get(tid, 0.0)
                offsets.append(before)
                totals[tid] = before + duration
            found = ChannelDeal(tids, tuple(offsets), tuple(sorted(totals.items())), tids[-1])
            self._deals[first] = found
        return found

    def args(self, first: int) -> tuple:
        """The spans' compact trace args for a deal starting on ``first`` (see
        ``simaccel.dma.engine._trace_args``)."""
        found = self._args.get(first)
        if found is None:
            tids = self.deal(first).tids
            found = tuple((n, self.kind, b, c, s, st, m) for n, b, c, s, st, m in zip(
                self.nbytes, self.bursts, tids, self.staged, self.strided, self.mapped))
            self._args[first] = found
        return found


def strided_facts(srcs: Sequence[np.ndarray], mapped: Sequence[bool]) -> tuple[Any, ...]:
    """Per pair: None for a C-contiguous (or mapped) source, else its (shape, strides):
    what the trace shows of a gathered copy."""
    return tuple(None if m or s.flags.c_contiguous else (s.shape, s.strides)
                 for s, m in zip(srcs, mapped))


def make_plan(kind: str, srcs: Sequence[np.ndarray], dsts: Sequence[np.ndarray | None],
              labels: Sequence[str], staged: Sequence[bool] | None, mapped: tuple[bool, ...],
              timing: tuple[int, float, float, int], names: tuple[str, ...]) -> BatchPlan:
    """The plan of one batch instance for an engine of ``timing`` (channels, latency_ns,
    bandwidth_gbps, burst_bytes); ``names``: the spans' trace names."""
    count = len(srcs)
    staged_t = tuple(bool(x) for x in staged) if staged is not None else (False,) * count
    if any(mapped):
        check_mappable(kind)
    _, latency, bandwidth, burst = timing
    nbytes = tuple(int(s.nbytes if m else d.nbytes)  # type: ignore[union-attr]
                   for s, d, m in zip(srcs, dsts, mapped))
    bursts = tuple(-(-n // burst) for n in nbytes)
    mapped_bytes = [n for n, m in zip(nbytes, mapped) if m]
    totals = (sum(nbytes), sum(bursts), sum(n for n, st in zip(nbytes, staged_t) if st),
              sum(mapped_bytes), len(mapped_bytes))
    return BatchPlan(kind, tuple(labels), nbytes, staged_t, mapped,
                     tuple(latency + n / bandwidth for n in nbytes), bursts, names,
                     strided_facts(srcs, mapped), timing, totals,
                     tuple(i for i, m in enumerate(mapped) if not m),
                     any(staged_t) or any(mapped))


class PlannedPairError(Exception):
    """A planned batch's pair failed after ``done`` pairs moved (``cause``: why)."""

    def __init__(self, done: int, cause: BaseException):
        super().__init__(str(cause))
        self.done, self.cause = done, cause


def move_planned(plan: BatchPlan, srcs: Sequence[np.ndarray],
                 dsts: Sequence[np.ndarray | None], mapped_checked: bool = False) -> int:
    """Move a planned batch's bytes (check its mapped accesses, unless ``mapped_checked``:
    the caller checked those arrays already); returns the pairs moved. Raises
    :class:`PlannedPairError` naming how many moved before a bad pair."""
    done = 0
    try:
        if mapped_checked and True not in plan.staged:
            # only the copies move; a mapped pair has nothing left to do
            for done in plan.copied:
                dst, nbytes = dsts[done], plan.nbytes[done]
                if dst.nbytes != nbytes:  # type: ignore[union-attr]
                    _unplanned("DMA copy", plan.labels[done], dst.nbytes, nbytes)  # type: ignore[union-attr]
                copy_array(srcs[done], dst, False, plan.labels[done])  # type: ignore[arg-type]
            return len(plan.nbytes)
        if not plan.special:
            for src, dst, nbytes, label in zip(srcs, dsts, plan.nbytes, plan.labels):
                if dst.nbytes != nbytes:  # type: ignore[union-attr]
                    _unplanned("DMA copy", label, dst.nbytes, nbytes)  # type: ignore[union-attr]
                copy_array(src, dst, False, label)  # type: ignore[arg-type]
                done += 1
            return done
        for src, dst, nbytes, staged, mapped, label in zip(srcs, dsts, plan.nbytes,
                                                           plan.staged, plan.mapped,
                                                           plan.labels):
            if mapped:
                if mapped_bytes(src, staged, label, plan.kind) != nbytes:
                    _unplanned("mapped access", label, src.nbytes, nbytes)
            else:
                if dst.nbytes != nbytes:  # type: ignore[union-attr]
                    _unplanned("DMA copy", label, dst.nbytes, nbytes)  # type: ignore[union-attr]
                copy_array(src, dst, staged, label)  # type: ignore[arg-type]
            done += 1
        return done
    except Exception as exc:
        raise PlannedPairError(done, exc) from None


def check_timing(what: str, made_for: tuple, timing: tuple) -> None:
    """Refuse ``what`` (a batch or call plan) made for an engine of another ``timing``
    (channels, latency_ns, bandwidth_gbps, burst_bytes). Callers on the per-call path test
    ``made_for is not timing`` first: a plan made by the same engine shares its tuple."""
    if made_for != timing:
        raise ValueError(f"{what} was made for an engine with (channels, latency, bandwidth, "
                         f"burst) {made_for}, this one has {timing}; make the plan again")


def _unplanned(what: str, label: str, nbytes: int, planned: int) -> None:
    raise ValueError(f"{what} {label!r}: {nbytes} bytes, but the batch was planned for "
                     f"{planned}; make the plan again for these arrays")

"""The simulated DMA engine: channels as in-order queues, a compute track, stats, trace.

Modelled on Linux dmaengine (a client prepares descriptors, submits them, and waits on a
completion cookie) and on AWS Neuron DMA queues (several rings running in parallel).
Copies happen synchronously at submit -- the bytes really move -- while the *timing* is
simulated on a :class:`~simaccel.dma.clock.SimClock`:

* descriptors of one submit form a scatter-gather list, dealt round-robin over the
  channels (the cursor persists across submits, so back-to-back single-descriptor
  submits also spread over the channels);
* a descriptor costs ``latency_ns + nbytes / bandwidth_gbps`` ns (GB/s == bytes/ns):
  latency once, then its bursts of at most ``burst_bytes`` back to back;
* it starts at ``max(channel free time, not_before_ns)``; channels overlap each other
  and the compute track.

A *mapped* access (``mapped`` in :meth:`DmaEngine.copy_many`) is host memory the device
reads (h2d) or a kernel wrote (d2h) in place (zero-copy, CUDA mapped pinned memory): the
bytes still cross the bus, so it is placed, timed, traced and counted exactly like a copy
of its kind (and in ``h2d.mapped_bytes`` / ``h2d.mapped_reads``, ``d2h.mapped_bytes`` /
``d2h.mapped_writes``), but nothing is copied.

Every copy takes one path, :meth:`DmaEngine._transfer`; :meth:`~DmaEngine.submit`
(descriptor objects), :meth:`~DmaEngine.copy_many` (the runtime's per-call lists) and
:meth:`~DmaEngine.copy_one` are entry points into it. It checks the batch, then per pair
checks and moves the bytes, places the copy on a channel and traces it, and counts the batch
once. A bad pair stops its batch; what moved before it stays placed, traced and counted.
"""
from __future__ import annotations

import numbers
import os
import threading
from typing import Any, Iterable, Sequence

import numpy as np

from simaccel.dma.call import CallPlan, make_call
from simaccel.dma.clock import SimClock
from simaccel.dma.copy import check_mappable, copy_each, copy_plain
from simaccel.dma.completion import Completion, DescriptorTiming, kind_runs
from simaccel.dma.descriptor import KINDS, Descriptor
from simaccel.dma.plan import (BatchPlan, PlannedPairError, check_timing, make_plan,
                               move_planned)
from simaccel.dma.spans import span_names, span_names_of, trace_args
from simaccel.dma.stats import STAT_KEYS, count_batch, zero_stats
from simaccel.dma.trace import PLANNED, DEFAULT_MAX_EVENTS, TraceEvent, TraceRecorder

COMPUTE_TRACK = "compute"
#: most program calls :meth:`DmaEngine.record_call_later` holds before placing them (a
#: loop that never reads the engine keeps a bounded list; each waits at most this long)
PENDING_CALLS_MAX = 64


class _SettlingLock:
    """The engine's lock: taking it places the calls :meth:`DmaEngine.record_call_later`
    holds first, so whatever runs under it (a placement, a read of the timeline, trace or
    counters) sees them placed as if each had been when it came. ``raw``: the lock
    alone."""

    __slots__ = ("raw", "_place")

    def __init__(self, place: Any) -> None:
        self.raw = threading.Lock()
        self._place = place

    def __enter__(self) -> None:
        self.raw.acquire()
        try:
            self._place()
        except BaseException:
            self.raw.release()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.raw.release()


def channel_track(index: int) -> str:
    """Name of DMA channel ``index``'s track (as shown in the trace)."""
    return f"DMA channel {index}"


class DmaEngine:
    """A DMA engine with ``channels`` parallel in-order queues and one compute track.

    channels: number of DMA channels (>= 1).
    burst_bytes: largest burst a descriptor is split into (bytes, >= 1).
    bandwidth_gbps: bandwidth of one channel (GB/s == bytes/ns, > 0).
    latency_ns: fixed cost paid once per descriptor (ns, >= 0).
    max_trace_events: size of the trace ring (oldest events are dropped).

    Thread safe: every public method takes the engine's lock.
    """

    def __init__(self, channels: int, burst_bytes: int, bandwidth_gbps: float,
                 latency_ns: float, *, max_trace_events: int = DEFAULT_MAX_EVENTS):
        if isinstance(channels, bool) or not isinstance(channels, numbers.Integral) \
                or channels < 1:
            raise ValueError(f"DmaEngine channels must be an int >= 1, got {channels!r}")
        if isinstance(burst_bytes, bool) or not isinstance(burst_bytes, numbers.Integral) \
                or burst_bytes < 1:
            raise ValueError(f"DmaEngine burst_bytes must be an int >= 1, got {burst_bytes!r}")
        if not bandwidth_gbps > 0:
            raise ValueError(f"DmaEngine bandwidth_gbps must be > 0, got {bandwidth_gbps!r}")
        if not latency_ns >= 0:
            raise ValueError(f"DmaEngine latency_ns must be >= 0, got {latency_ns!r}")
        self.channels = int(channels)
        self.burst_bytes = int(burst_bytes)
        self.bandwidth_gbps = float(bandwidth_gbps)
        self.latency_ns = float(latency_ns)
        tracks = [channel_track(i) for i in range(channels)] + [COMPUTE_TRACK]
        self._lock = _SettlingLock(self._place_pending)
        self._clock = SimClock(tracks)
        self._trace = TraceRecorder(tracks, max_trace_events, decode_args=trace_args)
        self._next_channel = 0
        self._stats = zero_stats()
        #: calls placed by record_call and not yet in ``_stats``, per call plan
        self._calls: dict[CallPlan, int] = {}
        #: (call plan, ready ns) of the calls record_call_later holds, oldest first
        self._pending: list[tuple[CallPlan, float]] = []
        self._tracks = tracks  # by channel index, then compute (names precomputed: hot path)
        self._channel_tracks = tracks[:channels]
        #: what a :class:`BatchPlan` is made for: plans of other timings are refused
        self._timing = (self.channels, self.latency_ns, self.bandwidth_gbps, self.burst_bytes)

    def descriptor_time_ns(self, nbytes: int) -> float:
        """Simulated time of one descriptor of ``nbytes`` bytes on an idle channel (ns)."""
        return self.latency_ns + nbytes / self.bandwidth_gbps

    def submit(self, descriptors: Iterable[Descriptor], *, not_before_ns: float = 0.0
               ) -> Completion:
        """Copy every descriptor now and schedule them on the channels in order (see the
        module doc). A submit may mix kinds; each kind in it counts one transfer."""
        descs = descriptors if isinstance(descriptors, list) else list(descriptors)
        for d in descs:
            if type(d) is not Descriptor and not isinstance(d, Descriptor):
                raise TypeError(f"submit() takes Descriptor objects, got {type(d).__name__}")
        if not descs:
            return Completion(float(not_before_ns), float(not_before_ns))
        placed: list[tuple[int, float, float, int]] = []
        runs = kind_runs(descs)
        with self._lock:
            if len(runs) == 1:
                self._transfer(runs[0][0], *runs[0][1], None, not_before_ns, placed)
            else:
                self._transfer_runs(runs, not_before_ns, placed)
        timings = tuple([DescriptorTiming(d, *p) for d, p in zip(descs, placed)])
        if len(timings) == 1:
            return Completion(timings[0].start_ns, timings[0].end_ns, timings)
        return Completion(min(t.start_ns for t in timings), max(t.end_ns for t in timings),
                          timings)

    def _transfer_runs(self, runs: list[tuple[str, tuple[list, ...]]], not_before_ns: float,
                       placed: list[tuple[int, float, float, int]]) -> None:
        """A submit of several runs of kinds, placed in order: each kind's runs are counted
        on the side, then added to the stats as one transfer of that kind (and one staged
        transfer if it staged bytes), as if the kind had been one run."""
        per_kind: dict[str, dict[str, float]] = {}
        try:
            for kind, columns in runs:
                self._transfer(kind, *columns, None, not_before_ns, placed,
                               per_kind.setdefault(kind, zero_stats()))
        finally:  # what moved before a bad descriptor is counted
            for kind, counts in per_kind.items():
                for key in (STAT_KEYS[kind][1], "staged.transfers"):
                    counts[key] = min(counts[key], 1)
                for key, value in counts.items():
                    self._stats[key] += value

    def copy_many(self, kind: str, srcs: Sequence[np.ndarray],
                  dsts: Sequence[np.ndarray | None], labels: Sequence[str], *,
                  staged: Sequence[bool] | None = None, mapped: Sequence[bool] | None = None,
                  not_before_ns: float = 0.0) -> float:
        """One scatter-gather submit of ``kind`` copying ``srcs[i]`` into ``dsts[i]``: the
        same copies, timing, stats and trace as :meth:`submit` with one :class:`Descriptor`
        per pair, minus the objects (the runtime calls this on every graph call). Where
        ``mapped[i]`` (h2d and d2h only) ``srcs[i]`` is a mapped access (a C-contiguous host
        array the device reads, or a kernel wrote, in place: see the module doc) and
        ``dsts[i]`` is ignored (None).
        Returns the end of the last copy (ns; ``not_before_ns`` if there is none)."""
        with self._lock:
            return self._transfer(kind, srcs, dsts, labels, staged, mapped, not_before_ns)

    def plan_batch(self, kind: str, srcs: Sequence[np.ndarray],
                   dsts: Sequence[np.ndarray | None], labels: Sequence[str], *,
                   staged: Sequence[bool] | None = None,
                   mapped: Sequence[bool] | None = None) -> BatchPlan:
        """The :class:`~simaccel.dma.plan.BatchPlan` of a batch :meth:`copy_planned` will
        move again and again, made from one instance of its pairs (arguments as for
        :meth:`copy_many`): later calls must pass pairs of the same dtypes, element
        counts and layouts (a program's per-call inputs and outputs, fixed by its guards
        and its workspace)."""
        if kind not in STAT_KEYS:
            raise ValueError(f"DMA copy kind must be one of {KINDS}, got {kind!r}")
        mapped_t = tuple(bool(x) for x in mapped) if mapped is not None else (False,) * len(srcs)
        return make_plan(kind, srcs, dsts, labels, staged, mapped_t, self._timing,
                         span_names_of(kind, tuple(labels), mapped_t))

    def copy_planned(self, plan: BatchPlan, srcs: Sequence[np.ndarray],
                     dsts: Sequence[np.ndarray | None], *, not_before_ns: float = 0.0,
                     mapped_checked: bool = False) -> float:
        """:meth:`copy_many` of a planned batch (:meth:`plan_batch`): the same copies,
        timing, stats and trace, placed with one step per channel and traced as one
        entry. Returns the end of the last copy (ns). A bad pair stops the batch; what
        moved before it is placed, traced and counted, as :meth:`copy_many` does.
        ``mapped_checked``: the caller checked the mapped arrays against the plan (as a
        runtime binding kernels to them does): only the copies are looked at."""
        try:
            self.move_batch(plan, srcs, dsts, mapped_checked=mapped_checked)
        except PlannedPairError as failed:
            self.place_moved(plan, failed.done, not_before_ns)
            raise failed.cause from None
        with self._lock:
            return self._place_planned(plan, not_before_ns)

    def move_batch(self, plan: BatchPlan, srcs: Sequence[np.ndarray],
                   dsts: Sequence[np.ndarray | None], *, mapped_checked: bool = False) -> None:
        """Move a planned batch's bytes (arguments as for :meth:`copy_planned`) without
        placing it: a program call moves its batches and runs its kernels, then places
        them all at once (:meth:`record_call`). Raises
        :class:`~simaccel.dma.plan.PlannedPairError` (how many pairs moved, and why) at a
        bad pair; :meth:`place_moved` places those."""
        if plan.timing is not self._timing:
            check_timing("DMA batch plan", plan.timing, self._timing)
        if len(srcs) != len(plan.nbytes) or len(dsts) != len(plan.nbytes):
            raise ValueError(f"DMA batch plan has {len(plan.nbytes)} pairs, got "
                             f"{len(srcs)} sources and {len(dsts)} destinations")
        move_planned(plan, srcs, dsts, mapped_checked)

    def place_moved(self, plan: BatchPlan, done: int, not_before_ns: float = 0.0) -> float:
        """Place, trace and count the first ``done`` pairs of a planned batch that
        stopped at a bad pair; returns their end (ns)."""
        with self._lock:
            return self._place(plan.kind, STAT_KEYS[plan.kind], plan.labels, [
                (plan.nbytes[i], plan.staged[i], plan.mapped[i], plan.strided[i])
                for i in range(done)], not_before_ns, None, None)

    def plan_call(self, uploads: Sequence[BatchPlan], kernels: Sequence[str],
                  durations: Sequence[float], download: BatchPlan | None) -> CallPlan:
        """The :class:`~simaccel.dma.call.CallPlan` of a program call (its upload
        batches, its kernels' names and simulated times in ns, its download batch) that
        :meth:`record_call` places again and again."""
        return make_call(tuple(uploads), tuple(kernels), tuple(durations), download,
                         self._timing)

    def record_call(self, call: CallPlan, not_before_ns: float = 0.0,
                    ready_ns: float = 0.0) -> float:
        """Place, trace and count one call of ``call`` whose batches moved
        (:meth:`move_batch`) and whose kernels ran: the uploads from ``not_before_ns``,
        the kernels back to back once the uploads and ``ready_ns`` (other data the
        kernels wait for) are done, the download after the last kernel. One ring entry
        and one count per call (:mod:`simaccel.dma.call`). Returns the end of its last
        item (ns)."""
        if call.timing is not self._timing:
            check_timing("call plan", call.timing, self._timing)
        with self._lock:
            return self._place_call(call, not_before_ns, ready_ns)

    def record_call_later(self, call: CallPlan, ready_ns: float = 0.0) -> None:
        """:meth:`record_call` from time 0 without its end: the call is placed, traced and
        counted when the engine next places anything else or is read (its timeline,
        trace, counters), or once :data:`PENDING_CALLS_MAX` calls wait, in the order the
        calls came: the same placements as one at a time. A replayed call places nothing
        else, so its placement runs later in a loop with the others: ~3 us a call there,
        10-12 us between a training step's kernels, whose work left the caches cold."""
        if call.timing is not self._timing:
            check_timing("call plan", call.timing, self._timing)
        with self._lock.raw:  # the call joins the held ones, placing none of them
            pending = self._pending
            pending.append((call, ready_ns))
            if len(pending) >= PENDING_CALLS_MAX:
                self._place_pending()

    def _place_pending(self) -> None:
        """Place the calls :meth:`record_call_later` holds, in order (the lock held)."""
        if self._pending:
            pending, self._pending = self._pending, []
            for call, ready_ns in pending:
                self._place_call(call, 0.0, ready_ns)

    def _place_call(self, call: CallPlan, not_before_ns: float, ready_ns: float) -> float:
        """Place, trace and count one call (the lock held); returns its end (ns)."""
        first = self._next_channel
        layout = call._layouts.get(first) or call.layout(first)
        starts, start, end = self._clock.reserve_call(
            self._channel_tracks, layout.uploads, COMPUTE_TRACK, call.durations,
            layout.download, not_before_ns, ready_ns)
        self._trace.record_call((layout.spans, layout.entry, tuple(starts), start))
        self._next_channel = layout.next_channel
        calls = self._calls
        calls[call] = calls.get(call, 0) + 1
        return end

    def _fold_calls(self) -> None:
        """Add the calls :meth:`record_call` counted per plan to the counters."""
        stats = self._stats
        for call, times in self._calls.items():
            for plan in call.batches:
                if not plan.nbytes:  # an empty batch moved nothing: not a transfer
                    continue
                count_batch(stats, STAT_KEYS[plan.kind], len(plan.nbytes), *plan.totals,
                            times=times)
            stats["compute_items"] += len(call.kernels) * times
            stats["compute_ns"] += call.kernel_ns * times
        self._calls.clear()

    def _place_planned(self, plan: BatchPlan, not_before_ns: float) -> float:
        """Place, trace and count a planned batch whose bytes moved; returns its end (ns)."""
        if not plan.nbytes:
            return not_before_ns
        first = self._next_channel
        deal = plan.deal(first)
        starts = self._clock.reserve_shares(self._channel_tracks, deal.active, not_before_ns)
        channel_starts = [0.0] * self.channels
        end = not_before_ns
        for (tid, total), start in zip(deal.active, starts):
            channel_starts[tid] = start
            if start + total > end:
                end = start + total
        self._trace.record_batch((plan.kind, plan.names, deal.tids, deal.offsets,
                                  plan.durations, tuple(channel_starts), plan.args(first),
                                  PLANNED))
        self._next_channel = deal.last + 1 if deal.last + 1 < self.channels else 0
        count_batch(self._stats, STAT_KEYS[plan.kind], len(plan.nbytes), *plan.totals)
        return end

    def copy_one(self, kind: str, src: np.ndarray, dst: np.ndarray, label: str, *,
                 staged: bool = False, not_before_ns: float = 0.0) -> float:
        """:meth:`copy_many` of one pair, without the lists (the constant bank's update
        rides on every call whose lifted scalars changed). Returns its end (ns)."""
        with self._lock:
            return self._transfer(kind, (src,), (dst,), (label,), (staged,) if staged else None,
                                  None, not_before_ns)

    def _transfer(self, kind: str, srcs: Sequence[np.ndarray],
                  dsts: Sequence[np.ndarray | None], labels: Sequence[str],
                  staged: Sequence[bool] | None, mapped: Sequence[bool] | None,
                  not_before_ns: float, placed: list | None = None,
                  stats: dict[str, float] | None = None) -> float:
        """The one copy path (the caller holds the lock): check the batch; per pair, move
        the bytes (or check the mapped read); then place the pairs round-robin on the
        channels, trace them and count the batch once, into ``stats`` (default: the
        engine's). A bad pair stops the batch: what moved before it is placed, traced and
        counted. ``placed`` gets
        (channel, start_ns, end_ns, bursts) per pair. Returns the latest end (ns)."""
        try:
            keys = STAT_KEYS[kind]
        except KeyError:
            raise ValueError(f"DMA copy kind must be one of {KINDS}, got {kind!r}") from None
        if mapped is not None:
            check_mappable(kind)
        # Two passes, plain locals: move every pair's bytes (or check its mapped read),
        # then place the batch on the channels and trace it with one call each; this runs
        # on every graph call, with a few dozen pairs.
        moved: list[tuple[int, bool, bool, Any]] = []  # (bytes, staged, mapped, strided)
        try:
            if mapped is None and not (staged and any(staged)):
                copy_plain(srcs, dsts, labels, moved)
            else:
                copy_each(kind, srcs, dsts, labels, staged, mapped, moved)
        finally:  # what moved before a bad pair is placed, traced and counted
            end = self._place(kind, keys, labels, moved, not_before_ns, placed, stats)
        return end

    def _place(self, kind: str, keys: tuple[str, str], labels: Sequence[str],
               moved: list[tuple[int, bool, bool, Any]], not_before_ns: float,
               placed: list | None, stats: dict[str, float] | None) -> float:
        """Place the moved pairs of one batch round-robin over the channels, trace them
        and count the batch once; returns the latest end (ns)."""
        if not moved:
            return not_before_ns
        latency, bandwidth, burst = self.latency_ns, self.bandwidth_gbps, self.burst_bytes
        times = self._clock.reserve_round_robin(
            self._channel_tracks, self._next_channel,
            [latency + m[0] / bandwidth for m in moved], not_before_ns)
        channels, starts, ends = zip(*times)
        bursts = [-(-m[0] // burst) for m in moved]
        # one trace entry and one count per batch: the spans' names and args are made
        # when the trace is read (this runs on every call)
        self._trace.record_batch((
            kind, span_names(kind, tuple(labels[:len(moved)]), moved), channels, starts, ends,
            tuple([(m[0], kind, b, c, m[1], m[3], m[2])
                   for m, b, c in zip(moved, bursts, channels)])))
        if placed is not None:
            placed += zip(channels, starts, ends, bursts)
        last = channels[-1]
        self._next_channel = last + 1 if last + 1 < self.channels else 0
        staged_bytes = in_place_bytes = in_place = 0
        for nbytes, is_staged, is_mapped, _ in moved:
            if is_staged:
                staged_bytes += nbytes
            if is_mapped:
                in_place_bytes, in_place = in_place_bytes + nbytes, in_place + 1
        count_batch(self._stats if stats is None else stats, keys, len(moved),
               sum(m[0] for m in moved), sum(bursts), staged_bytes, in_place_bytes, in_place)
        return max(not_before_ns, max(ends))

    def schedule_compute(self, name: str, duration_ns: float, not_before_ns: float = 0.0,
                         *, args: dict[str, Any] | None = None) -> tuple[float, float]:
        """Put a kernel of ``duration_ns`` on the serial compute track; returns (start, end) ns."""
        with self._lock:
            tid = self.channels
            start, end = self._clock.reserve(COMPUTE_TRACK, duration_ns, not_before_ns)
            self._trace.record_span(name, "compute", tid, start, end - start,
                                    dict(args) if args else ())
            self._stats["compute_items"] += 1
            self._stats["compute_ns"] += float(duration_ns)
            return start, end

    @property
    def now_ns(self) -> float:
        """End of the latest item on any track (ns)."""
        with self._lock:
            return self._clock.now_ns

    @property
    def compute_free_ns(self) -> float:
        """Time the compute track finishes its queued kernels (ns)."""
        with self._lock:
            return self._clock.free_at(COMPUTE_TRACK)

    def channel_free_ns(self, channel: int) -> float:
        """Time DMA channel ``channel`` finishes its queued descriptors (ns)."""
        with self._lock:
            return self._clock.free_at(channel_track(channel))

    def stats(self) -> dict[str, float]:
        """Flat counters: ``{kind}.bytes``/``{kind}.transfers`` for h2d, d2h, const, d2d,
        collective.d2h, collective.h2d and staged; ``h2d.mapped_bytes``/``h2d.mapped_reads``
        and ``d2h.mapped_bytes``/``d2h.mapped_writes`` (mapped accesses, also counted in
        their kind's bytes and in ``descriptors``); ``descriptors``; ``bursts``;
        ``busy_ns`` (sum of channel busy time, ns); ``compute_ns``/``compute_items``; ``timeline_ns`` (latest end on any track, ns)."""
        with self._lock:
            self._fold_calls()
            out = dict(self._stats)
            out["busy_ns"] = sum(self._clock.busy_ns(channel_track(i))
                                 for i in range(self.channels))
            out["timeline_ns"] = self._clock.now_ns
            return out

    def reset_stats(self) -> None:
        """Zero the counters, clear the trace and restart the timeline at 0 ns."""
        with self._lock:
            self._stats = zero_stats()
            self._calls.clear()
            self._clock.reset()
            self._trace.clear()
            self._next_channel = 0

    def trace_events(self) -> list[TraceEvent]:
        """The retained trace events, oldest first."""
        with self._lock:
            return self._trace.events()

    def chrome_trace(self, **process: Any) -> dict[str, Any]:
        """The trace as a Chrome Trace Event JSON object (``process``: its ``pid`` and
        ``process_name``)."""
        with self._lock:
            return self._trace.to_chrome_trace(**process)

    def export_chrome_trace(self, path: str | os.PathLike[str], **process: Any) -> None:
        """Write the trace to ``path`` as Chrome Trace Event JSON (loadable in Perfetto)."""
        with self._lock:
            self._trace.export(path, **process)

"""Trace events of the simulated timeline and their export as Chrome Trace Event JSON.

The JSON follows the Trace Event Format ("X" complete events plus "M" metadata naming
each track) so ``chrome://tracing`` and https://ui.perfetto.dev load it directly.
"""
from __future__ import annotations

import collections
import json
import os
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any, Callable

#: Process id used for every event: one simulated device.
TRACE_PID = 1
#: Default ring size; a long benchmark keeps only the newest events.
DEFAULT_MAX_EVENTS = 100_000


@dataclass(slots=True)
class TraceEvent:
    """One item on a track: ``tid`` is the track's index, times in ns."""

    name: str
    cat: str
    tid: int
    start_ns: float
    dur_ns: float
    args: dict[str, Any] = field(default_factory=dict)


#: What the ring holds: (name, cat, tid, start_ns, dur_ns, args). Recording is on every
#: call's hot path, so events are plain tuples and ``args`` is a dict or a compact tuple of
#: numbers and strings that the recorder's ``decode_args`` expands when the trace is read.
#: Such tuples hold no references the garbage collector must follow, so a ring of 100k
#: events costs the collector nothing; :class:`TraceEvent` objects are made on export.
RawEvent = tuple[str, str, int, float, float, Any]


#: The spans of one scatter-gather submit as one ring entry (the DMA engine records one
#: per submit, on every call's hot path; spans are made when the trace is read):
#: (cat, names, tids, starts_ns, ends_ns, args), each a tuple with an item per span.
#: Plain tuples of numbers and strings, like :data:`RawEvent`, so the ring stays
#: invisible to the garbage collector.
SpanBatch = tuple[str, tuple, tuple, tuple, tuple, tuple]


#: A planned batch (:class:`simaccel.dma.plan.BatchPlan`) as one ring entry: (cat, names,
#: tids, offsets_ns, durations_ns, channel_starts_ns, args, PLANNED). All but
#: ``channel_starts_ns`` (when each track's share starts, by track index) are the plan's
#: tuples, shared by every call, so recording one costs one small tuple; a span starts
#: at its track's start plus its offset there, made when the trace is read.
PlannedBatch = tuple[str, tuple, tuple, tuple, tuple, tuple, tuple, str]
#: the marker item of a :data:`PlannedBatch`
PLANNED = "planned"


#: One program call (:class:`simaccel.dma.call.CallPlan`) as one ring entry: (spans,
#: parts, share_starts_ns, compute_start_ns). ``parts`` is the plan's layout entry (plain
#: tuples shared by every call: per batch its (cat, names, tids, offsets_ns,
#: durations_ns, args, active tids), the number of uploads, the kernels' names and
#: durations, the compute track); ``share_starts_ns``: when each batch's channel shares
#: start, batch by batch in active-channel order.
CallEntry = tuple[int, tuple, tuple, float]


def call_spans(entry: CallEntry) -> list[RawEvent]:
    """The spans of a :data:`CallEntry`: the uploads' copies, the kernels back to back
    from ``compute_start_ns`` (each starting where the one before ended, as the compute
    track places them one by one), then the download's copies."""
    _, (batches, uploads, kernels, durations, compute_tid), starts, compute_start = entry
    raws: list[RawEvent] = []
    shares = iter(starts)
    for index, (cat, names, tids, offsets, spans_ns, args, active) in enumerate(batches):
        if index == uploads:  # the download follows the kernels
            raws += _kernel_spans(kernels, durations, compute_tid, compute_start)
        channel_starts = {tid: next(shares) for tid in active}
        raws += [(name, cat, tid, channel_starts[tid] + offset, duration, arg)
                 for name, tid, offset, duration, arg
                 in zip(names, tids, offsets, spans_ns, args)]
    if uploads == len(batches):  # no download
        raws += _kernel_spans(kernels, durations, compute_tid, compute_start)
    return raws


def _kernel_spans(kernels: tuple, durations: tuple, tid: int, start: float) -> list[RawEvent]:
    """Kernels back to back from ``start`` (ns), each ending where the next starts."""
    raws: list[RawEvent] = []
    for name, duration in zip(kernels, durations):
        end = start + duration
        raws.append((name, "compute", tid, start, end - start, ()))
        start = end
    return raws


def _entry_spans(entry: Any) -> int:
    """How many spans a ring entry holds (a span, a batch or a call)."""
    if type(entry[0]) is int:
        return entry[0]
    return len(entry[2]) if type(entry[1]) is tuple else 1


def batch_spans(batch: SpanBatch | PlannedBatch) -> list[RawEvent]:
    """The spans of a :data:`SpanBatch` or a :data:`PlannedBatch`."""
    if len(batch) == 8:
        cat, names, tids, offsets, durations, channel_starts, args, _ = batch
        return [(name, cat, tid, channel_starts[tid] + offset, duration, arg)
                for name, tid, offset, duration, arg
                in zip(names, tids, offsets, durations, args)]
    cat, names, tids, starts, ends, args = batch  # type: ignore[misc]
    return [(name, cat, tid, start, end - start, arg)
            for name, tid, start, end, arg in zip(names, tids, starts, ends, args)]


class TraceRecorder:
    """A bounded ring of trace events plus the names of the tracks (not thread safe; the
    engine holds its lock around every call)."""

    def __init__(self, track_names: list[str], max_events: int = DEFAULT_MAX_EVENTS,
                 decode_args: Callable[[tuple], dict[str, Any]] | None = None):
        if max_events <= 0:
            raise ValueError(f"max_events must be positive, got {max_events}")
        self.track_names = list(track_names)
        self.max_events = max_events
        #: spans (6-tuples), span batches (:data:`SpanBatch`, :data:`PlannedBatch`: the
        #: second item is a tuple) and calls (:data:`CallEntry`: the first item is an
        #: int), oldest first; ``_held`` spans in all
        self._events: collections.deque[Any] = collections.deque()
        self._held = 0
        self._recorded = 0  # since the last clear; the ring holds the newest of them
        self._decode_args = decode_args

    @property
    def dropped(self) -> int:
        """Events recorded since the last :meth:`clear` that the ring no longer holds."""
        return self._recorded - self._held

    def record(self, event: TraceEvent) -> None:
        """Append an event, dropping the oldest when the ring is full."""
        self.record_span(event.name, event.cat, event.tid, event.start_ns, event.dur_ns,
                         dict(event.args))

    def record_span(self, name: str, cat: str, tid: int, start_ns: float, dur_ns: float,
                    args: dict[str, Any] | tuple) -> None:
        """Append one span (times in ns). ``args``: a dict, or a tuple the recorder's
        ``decode_args`` expands when the trace is read (it must not hold arrays: the ring
        outlives the call)."""
        self._events.append((name, cat, tid, start_ns, dur_ns, args))
        self._added(1)

    def record_batch(self, batch: SpanBatch | PlannedBatch) -> None:
        """Append the spans of one submit as one entry (see :data:`SpanBatch` and
        :data:`PlannedBatch`)."""
        self._events.append(batch)
        self._added(len(batch[2]))

    def record_call(self, entry: CallEntry) -> None:
        """Append one program call as one entry (see :data:`CallEntry`)."""
        self._events.append(entry)
        self._added(entry[0])

    def _added(self, count: int) -> None:
        """Count ``count`` new spans; drop the oldest entries past ``max_events`` spans
        (a batch goes whole, so the ring may hold fewer spans than that)."""
        self._recorded += count
        self._held += count
        events = self._events
        while self._held > self.max_events:
            oldest = events.popleft()
            self._held -= _entry_spans(oldest)

    def events(self) -> list[TraceEvent]:
        """The retained events, oldest first."""
        raws: list[RawEvent] = []
        for entry in self._events:
            if type(entry[0]) is int:
                raws += call_spans(entry)  # type: ignore[arg-type]
            elif type(entry[1]) is tuple:
                raws += batch_spans(entry)  # type: ignore[arg-type]
            else:
                raws.append(entry)
        return [self._event(raw) for raw in raws]

    def _event(self, raw: RawEvent) -> TraceEvent:
        name, cat, tid, start_ns, dur_ns, args = raw
        if isinstance(args, tuple):
            if self._decode_args is None:
                raise TypeError(f"trace event {name!r} has tuple args but the recorder has "
                                "no decode_args")
            args = self._decode_args(args)
        return TraceEvent(name, cat, tid, start_ns, dur_ns, dict(args))

    def clear(self) -> None:
        """Forget every event."""
        self._events.clear()
        self._held = self._recorded = 0

    def to_chrome_trace(self, pid: int = TRACE_PID,
                        process_name: str = "simaccel device") -> dict[str, Any]:
        """The trace as a Chrome Trace Event JSON object (``ts``/``dur`` in microseconds);
        ``pid``/``process_name``: the process the tracks belong to (one per rank when the
        traces of several ranks are merged)."""
        out: list[dict[str, Any]] = [
            {"ph": "M", "pid": pid, "tid": 0, "name": "process_name",
             "args": {"name": process_name}}]
        for tid, name in enumerate(self.track_names):
            out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                        "args": {"name": name}})
            out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                        "args": {"sort_index": tid}})
        for ev in self.events():
            out.append({"ph": "X", "pid": pid, "tid": ev.tid, "name": ev.name,
                        "cat": ev.cat, "ts": ev.start_ns / 1000.0,
                        "dur": ev.dur_ns / 1000.0, "args": dict(ev.args)})
        return {"traceEvents": out, "displayTimeUnit": "ns",
                "otherData": {"dropped_events": self.dropped}}

    def export(self, path: str | os.PathLike[str], **process: Any) -> None:
        """Write :meth:`to_chrome_trace` (``process``: its pid/process_name) to ``path``."""
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_chrome_trace(**process), fh)


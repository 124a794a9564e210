"""Trace events of the simulated timeline and their export as Chrome Trace Event JSON.

The JSON follows the Trace Event Format ("X" complete events plus "M" metadata naming
each track) so ``chrome://tracing`` and https://ui.perfetto.dev load it directly.
"""
from __future__ import annotations

import collections
import json
import os
from dataclasses import dataclass, field
from typing import Any

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


class TraceRecorder:
    """A bounded ring of :class:`TraceEvent` plus the names of the tracks (not thread safe;
    the engine holds its lock around every call)."""

    def __init__(self, track_names: list[str], max_events: int = DEFAULT_MAX_EVENTS):
        if max_events <= 0:
            raise ValueError(f"max_events must be positive, got {max_events}")
        self.track_names = list(track_names)
        self._events: collections.deque[TraceEvent] = collections.deque(maxlen=max_events)
        self.dropped = 0

    def record(self, event: TraceEvent) -> None:
        """Append an event, dropping the oldest when the ring is full."""
        events = self._events
        if len(events) == events.maxlen:
            self.dropped += 1
        events.append(event)

    def events(self) -> list[TraceEvent]:
        """The retained events, oldest first."""
        return list(self._events)

    def clear(self) -> None:
        """Forget every event."""
        self._events.clear()
        self.dropped = 0

    def to_chrome_trace(self) -> dict[str, Any]:
        """The trace as a Chrome Trace Event JSON object (``ts``/``dur`` in microseconds)."""
        out: list[dict[str, Any]] = [
            {"ph": "M", "pid": TRACE_PID, "tid": 0, "name": "process_name",
             "args": {"name": "simaccel device"}}]
        for tid, name in enumerate(self.track_names):
            out.append({"ph": "M", "pid": TRACE_PID, "tid": tid, "name": "thread_name",
                        "args": {"name": name}})
            out.append({"ph": "M", "pid": TRACE_PID, "tid": tid, "name": "thread_sort_index",
                        "args": {"sort_index": tid}})
        for ev in self._events:
            out.append({"ph": "X", "pid": TRACE_PID, "tid": ev.tid, "name": ev.name,
                        "cat": ev.cat, "ts": ev.start_ns / 1000.0,
                        "dur": ev.dur_ns / 1000.0, "args": dict(ev.args)})
        return {"traceEvents": out, "displayTimeUnit": "ns",
                "otherData": {"dropped_events": self.dropped}}

    def export(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_chrome_trace` to ``path`` as JSON."""
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_chrome_trace(), fh)

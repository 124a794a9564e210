"""How much of the collective traffic the simulated timeline hides under compute."""
from __future__ import annotations

import bisect
from typing import Any

from simaccel.runtime.device import Device, get_device

COLLECTIVE_KINDS = ("collective.d2h", "collective.h2d")


def collective_overlap(device: Device | None = None) -> dict[str, float]:
    """Of the collective DMA time in the device's trace (ns), the part that overlaps a
    kernel on the compute track: ``collective_ns``, ``hidden_ns``, ``hidden_fraction``
    (0 when there was no collective transfer). Reads the trace ring, so it covers the
    events it still holds (``DEFAULT_MAX_EVENTS``)."""
    events = (device or get_device()).dma.trace_events()
    compute = sorted((e.start_ns, e.start_ns + e.dur_ns) for e in events if e.cat == "compute")
    transfers = [(e.start_ns, e.start_ns + e.dur_ns) for e in events
                 if e.cat in COLLECTIVE_KINDS]
    total = sum(end - start for start, end in transfers)
    hidden = sum(_covered(start, end, compute) for start, end in transfers)
    return {"collective_ns": total, "hidden_ns": hidden,
            "hidden_fraction": hidden / total if total else 0.0}


def _covered(start: float, end: float, spans: list[tuple[float, float]]) -> float:
    """Length of [start, end) covered by ``spans`` (sorted, not overlapping each other:
    the compute track is serial)."""
    k = max(bisect.bisect_right(spans, (start, float("inf"))) - 1, 0)
    covered = 0.0
    while k < len(spans) and spans[k][0] < end:
        lo, hi = max(start, spans[k][0]), min(end, spans[k][1])
        covered += max(hi - lo, 0.0)
        k += 1
    return covered


def merge_traces(traces: list[dict[str, Any]]) -> dict[str, Any]:
    """Chrome traces of several ranks (each from ``device.dma.chrome_trace(
    **device.trace_process())``) as one trace with a process per rank."""
    events: list[dict[str, Any]] = []
    dropped = 0
    for trace in traces:
        events += trace["traceEvents"]
        dropped += trace.get("otherData", {}).get("dropped_events", 0)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"dropped_events": dropped}}

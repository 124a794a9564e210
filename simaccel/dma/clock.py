"""Simulated time: a set of serial tracks (DMA channels, compute) on one ns timeline.

Each track is an in-order resource: an item starts at ``max(track free time, not_before)``
and occupies the track for its duration. Different tracks overlap freely, which is how
copies on two channels, or a copy and a kernel, run in parallel.
"""
from __future__ import annotations


class SimClock:
    """Free times and busy totals of named serial tracks (all times in ns)."""

    def __init__(self, tracks: list[str]):
        if len(set(tracks)) != len(tracks):
            raise ValueError(f"SimClock track names must be unique, got {tracks}")
        self._free_ns: dict[str, float] = {name: 0.0 for name in tracks}
        self._busy_ns: dict[str, float] = {name: 0.0 for name in tracks}

    @property
    def tracks(self) -> list[str]:
        """Track names in creation order."""
        return list(self._free_ns)

    def free_at(self, track: str) -> float:
        """Time the track finishes its last item (ns)."""
        return self._free_ns[track]

    def busy_ns(self, track: str) -> float:
        """Total time items have occupied the track (ns)."""
        return self._busy_ns[track]

    def reserve(self, track: str, duration_ns: float, not_before_ns: float = 0.0
                ) -> tuple[float, float]:
        """Place an item of ``duration_ns`` on ``track``; returns its (start_ns, end_ns)."""
        return self.reserve_round_robin([track], 0, [duration_ns], not_before_ns)[0][1:]

    def reserve_round_robin(self, tracks: list[str], first: int, durations: list[float],
                            not_before_ns: float = 0.0) -> list[tuple[int, float, float]]:
        """Place ``durations[i]`` on ``tracks[(first + i) % len(tracks)]``, in order (a
        scatter-gather list dealt over the DMA channels), in one call: the per-call hot
        path places a few dozen copies at once. Returns (track index, start_ns, end_ns)
        per item."""
        free_ns, busy_ns = self._free_ns, self._busy_ns
        count = len(tracks)
        placed = []
        index = first
        for duration in durations:
            if duration < 0:
                raise ValueError(f"duration_ns must be >= 0, got {duration}")
            track = tracks[index]
            free = free_ns[track]
            start = free if free > not_before_ns else float(not_before_ns)
            end = start + duration
            free_ns[track] = end
            busy_ns[track] += duration
            placed.append((index, start, end))
            index = index + 1 if index + 1 < count else 0
        return placed

    def reserve_shares(self, tracks: list[str], shares: tuple[tuple[int, float], ...],
                       not_before_ns: float = 0.0) -> list[float]:
        """Place one share per ``(track index, total duration ns)`` in ``shares``: the
        items a batch deals to that track, back to back from ``max(free time,
        not_before_ns)`` (what :meth:`reserve_round_robin` does item by item). Returns
        each share's start (ns), in ``shares`` order."""
        free_ns, busy_ns = self._free_ns, self._busy_ns
        starts = []
        for index, total in shares:
            track = tracks[index]
            free = free_ns[track]
            start = free if free > not_before_ns else float(not_before_ns)
            free_ns[track] = start + total
            busy_ns[track] += total
            starts.append(start)
        return starts

    @property
    def now_ns(self) -> float:
        """End of the latest item over all tracks (ns); 0 when nothing ran."""
        return max(self._free_ns.values(), default=0.0)

    def reset(self) -> None:
        """Back to time 0 with every track idle."""
        for name in self._free_ns:
            self._free_ns[name] = 0.0
            self._busy_ns[name] = 0.0

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
        starts: list[float] = []
        _place_shares(self._free_ns, self._busy_ns, tracks, shares, not_before_ns, starts)
        return starts

    def reserve_serial(self, track: str, durations: tuple[float, ...],
                       not_before_ns: float = 0.0) -> tuple[float, float]:
        """Place ``durations`` on ``track`` back to back from ``max(free time,
        not_before_ns)`` (a call's kernels on the compute track: each waits for the one
        before it), summed in order as :meth:`reserve` would place them one by one.
        Returns (start_ns, end_ns); (not_before_ns, not_before_ns) and nothing placed
        when there are none."""
        if not durations:
            return not_before_ns, not_before_ns
        free_ns, busy_ns = self._free_ns, self._busy_ns
        free = free_ns[track]
        start = free if free > not_before_ns else float(not_before_ns)
        end, busy = start, busy_ns[track]
        for duration in durations:
            end += duration
            busy += duration
        free_ns[track] = end
        busy_ns[track] = busy
        return start, end

    def reserve_call(self, tracks: list[str], uploads: tuple[tuple[tuple[int, float], ...], ...],
                     compute: str, durations: tuple[float, ...],
                     download: tuple[tuple[int, float], ...], not_before_ns: float,
                     ready_ns: float) -> tuple[list[float], float, float]:
        """Place one program call: each upload batch's ``shares`` (as
        :meth:`reserve_shares`) from ``not_before_ns``; its kernels' ``durations`` on the
        ``compute`` track (as :meth:`reserve_serial`) once the uploads and ``ready_ns``
        are done; the ``download`` shares after the last kernel. Returns (every share's
        start in that order, the kernels' start, the end of the last item), all in ns."""
        free_ns, busy_ns = self._free_ns, self._busy_ns
        starts: list[float] = []
        end = ready_ns if ready_ns > not_before_ns else not_before_ns
        for shares in uploads:
            done = _place_shares(free_ns, busy_ns, tracks, shares, not_before_ns, starts)
            if done > end:
                end = done
        start = end
        if durations:  # inlined reserve_serial: this places every program call
            free = free_ns[compute]
            start = end = free if free > end else float(end)
            busy = busy_ns[compute]
            for duration in durations:  # in order, as one-by-one placement sums them
                end += duration
                busy += duration
            free_ns[compute], busy_ns[compute] = end, busy
        if download:
            end = _place_shares(free_ns, busy_ns, tracks, download, end, starts)
        return starts, start, end

    @property
    def now_ns(self) -> float:
        """End of the latest item over all tracks (ns); 0 when nothing ran."""
        return max(self._free_ns.values(), default=0.0)

    def reset(self) -> None:
        """Back to time 0 with every track idle."""
        for name in self._free_ns:
            self._free_ns[name] = 0.0
            self._busy_ns[name] = 0.0


def _place_shares(free_ns: dict[str, float], busy_ns: dict[str, float], tracks: list[str],
                  shares: tuple[tuple[int, float], ...], not_before_ns: float,
                  starts: list[float]) -> float:
    """Place each (track index, total ns) share from ``max(free time, not_before_ns)``,
    appending its start to ``starts``; returns the latest end (``not_before_ns`` if none)."""
    latest = not_before_ns
    for index, total in shares:
        track = tracks[index]
        free = free_ns[track]
        start = free if free > not_before_ns else float(not_before_ns)
        end = free_ns[track] = start + total
        busy_ns[track] += total
        starts.append(start)
        if end > latest:
            latest = end
    return latest

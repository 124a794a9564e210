"""Static memory planning: give every intermediate buffer of a program an arena offset.

Like XLA's buffer assignment / TVM's storage rewrite: buffers whose lifetimes (inclusive
step ranges) do not intersect may share bytes. The planner runs a few greedy orderings
(largest first, longest-lived first, earliest first), places each buffer at the
best-fitting gap among the already placed buffers it is live with, and keeps the smallest
result. It never does worse than giving each buffer its own bytes (``naive_bytes``).

Zero-byte buffers occupy nothing and are placed at offset 0.
"""
from __future__ import annotations

import functools
import random

from dataclasses import dataclass, field
from typing import Callable

from simaccel.errors import SimAccelError


@dataclass(frozen=True)
class PlanBuffer:
    """A buffer to place: ``nbytes`` bytes live from step ``first_use`` to ``last_use``
    (inclusive step indices)."""

    name: str
    nbytes: int
    first_use: int
    last_use: int

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            raise SimAccelError(f"PlanBuffer {self.name!r}: nbytes must be >= 0, "
                                f"got {self.nbytes}")
        if self.first_use > self.last_use:
            raise SimAccelError(f"PlanBuffer {self.name!r}: first_use {self.first_use} > "
                                f"last_use {self.last_use}")

    def lives_with(self, other: "PlanBuffer") -> bool:
        """True when the two lifetimes share at least one step."""
        return self.first_use <= other.last_use and other.first_use <= self.last_use


@dataclass(frozen=True)
class MemoryPlan:
    """Where each buffer lives.

    offsets: buffer name -> offset from the plan's base (bytes, multiple of ``alignment``).
    sizes: buffer name -> bytes it occupies (nbytes rounded up to ``alignment``).
    total_bytes: bytes the plan needs (its peak).
    lower_bound_bytes: max over steps of the live buffers' sizes; no plan can beat it.
    naive_bytes: sum of all sizes (every buffer its own bytes).
    strategy: name of the ordering that produced the plan.
    """

    offsets: dict[str, int]
    sizes: dict[str, int]
    total_bytes: int
    naive_bytes: int
    alignment: int
    strategy: str = "greedy_by_size"
    buffers: tuple[PlanBuffer, ...] = field(default=(), repr=False)

    @functools.cached_property
    def lower_bound_bytes(self) -> int:
        """Max over steps of the live buffers' sizes (bytes); no plan can beat it. Worked
        out when asked: reports and tests read it, and a dynamic program re-stacks its
        plan at every new size tuple (a decode step) without needing it."""
        return _lower_bound(list(self.buffers), self.sizes)

    def summary(self) -> str:
        """One line: total vs lower bound vs naive (bytes)."""
        return (f"memory plan ({self.strategy}): {self.total_bytes} bytes for "
                f"{len(self.offsets)} buffers (lower bound {self.lower_bound_bytes}, "
                f"naive {self.naive_bytes})")

    def check(self) -> None:
        """Raise SimAccelError if two live-together buffers overlap or an offset is unaligned."""
        by_name = {b.name: b for b in self.buffers}
        placed = [(b, self.offsets[b.name], self.sizes[b.name]) for b in by_name.values()]
        for i, (a, a_off, a_size) in enumerate(placed):
            if a_off % self.alignment or a_off + a_size > self.total_bytes:
                raise SimAccelError(f"plan puts {a.name!r} at bad offset {a_off}")
            for b, b_off, b_size in placed[i + 1:]:
                if a.lives_with(b) and a_off < b_off + b_size and b_off < a_off + a_size:
                    raise SimAccelError(f"plan overlaps live buffers {a.name!r} and {b.name!r}")


def _aligned(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


_ORDERINGS: dict[str, Callable[[PlanBuffer], tuple]] = {
    "greedy_by_size": lambda b: (-b.nbytes, b.first_use - b.last_use, b.name),
    "greedy_by_lifetime": lambda b: (b.first_use - b.last_use, -b.nbytes, b.name),
    "greedy_by_first_use": lambda b: (b.first_use, -b.nbytes, b.name),
}


def _place(order: list[PlanBuffer], sizes: dict[str, int], alignment: int,
           live_with: dict[str, list[str]]) -> dict[str, int]:
    """Offsets for ``order``: each buffer in the smallest gap, among placed buffers it is live
    with, that fits it (lowest offset on ties), else on top of them. ``live_with``: the
    non-empty buffers each buffer's lifetime intersects (:func:`_interference`)."""
    offsets: dict[str, int] = {}
    for buf in order:
        size = sizes[buf.name]
        if size == 0:
            offsets[buf.name] = 0
            continue
        busy = sorted((offsets[p], offsets[p] + sizes[p])
                      for p in live_with[buf.name] if p in offsets)
        best: tuple[int, int] | None = None  # (gap size, offset)
        cursor = 0
        for start, end in busy:
            gap = start - cursor
            if gap >= size and (best is None or (gap, cursor) < best):
                best = (gap, cursor)
            cursor = max(cursor, end)
        offsets[buf.name] = best[1] if best is not None else _aligned(cursor, alignment)
    return offsets


def _interference(buffers: list[PlanBuffer], sizes: dict[str, int]) -> dict[str, list[str]]:
    """For each buffer, the other non-empty buffers live with it (worked out once: every
    ordering :func:`_place` tries reads it; a GPT-2 graph tries ~60)."""
    live_with: dict[str, list[str]] = {b.name: [] for b in buffers}
    by_start = sorted((b for b in buffers if sizes[b.name]), key=lambda b: b.first_use)
    for k, a in enumerate(by_start):
        for b in by_start[k + 1:]:
            if b.first_use > a.last_use:
                break  # sorted by start: no later buffer meets ``a`` either
            live_with[a.name].append(b.name)
            live_with[b.name].append(a.name)
    return live_with


def _lower_bound(buffers: list[PlanBuffer], sizes: dict[str, int]) -> int:
    # The live set only grows at a first_use, so the peak is at one of them.
    return max((sum(sizes[b.name] for b in buffers if b.first_use <= step <= b.last_use)
                for step in {b.first_use for b in buffers}), default=0)


#: work budget of the randomized search (orderings x buffers^2 placements checked).
SEARCH_BUDGET = 400_000


def _random_search(buffers: list[PlanBuffer], sizes: dict[str, int], alignment: int,
                   best: tuple[int, str, dict[str, int]], lower_bound: int,
                   live_with: dict[str, list[str]]) -> tuple[int, str, dict[str, int]]:
    """Try seeded random orderings (deterministic) until the plan meets the liveness lower
    bound or the budget is spent: greedy orderings miss the optimum on small graphs."""
    n = max(len(buffers), 1)
    rng = random.Random(0)
    order = list(buffers)
    for _ in range(min(256, SEARCH_BUDGET // (n * n))):
        if best[0] <= lower_bound:
            break
        rng.shuffle(order)
        offsets = _place(order, sizes, alignment, live_with)
        total = max((offsets[b.name] + sizes[b.name] for b in buffers), default=0)
        if total < best[0]:
            best = (total, "randomized_search", offsets)
    return best


def plan_memory(buffers: list[PlanBuffer], alignment: int) -> MemoryPlan:
    """Assign offsets (bytes, multiples of ``alignment``) so that buffers with intersecting
    lifetimes never overlap; see the module doc for the strategy."""
    if alignment <= 0 or alignment & (alignment - 1):
        raise SimAccelError(f"alignment must be a power of two, got {alignment}")
    names = [b.name for b in buffers]
    if len(set(names)) != len(names):
        raise SimAccelError(f"plan_memory: buffer names must be unique, got {names}")
    sizes = {b.name: _aligned(b.nbytes, alignment) for b in buffers}
    naive = sum(sizes.values())
    best: tuple[int, str, dict[str, int]] | None = None
    live_with = _interference(buffers, sizes)
    for strategy, key in _ORDERINGS.items():
        offsets = _place(sorted(buffers, key=key), sizes, alignment, live_with)
        total = max((offsets[n] + sizes[n] for n in names), default=0)
        if best is None or total < best[0]:
            best = (total, strategy, offsets)
    if best is not None:
        best = _random_search(buffers, sizes, alignment, best,
                              _lower_bound(list(buffers), sizes), live_with)
    total, strategy, offsets = best if best is not None else (0, "empty", {})
    if total > naive:  # greedy can lose to the trivial layout; never return worse than it
        offsets, cursor = {}, 0
        for b in buffers:
            offsets[b.name] = 0 if sizes[b.name] == 0 else cursor
            cursor += sizes[b.name]
        total, strategy = naive, "naive"
    return MemoryPlan(offsets=offsets, sizes=sizes, total_bytes=total, naive_bytes=naive,
                      alignment=alignment, strategy=strategy, buffers=tuple(buffers))


class StackedPlan:
    """A plan made once, re-evaluated cheaply for other buffer sizes (dynamic shapes).

    The plan's placement is kept as a stacking order: each buffer sits on top of the
    buffers it is live with that the plan put below it. For new sizes, each buffer's
    offset is the aligned top of those (in the plan's bottom-up order), so buffers live
    together never overlap at any sizes, and at the sizes the plan was made for the result
    is never larger than the plan."""

    def __init__(self, plan: MemoryPlan):
        self.alignment = plan.alignment
        self.buffers = plan.buffers
        # zero-byte buffers last: they stack on everything they are live with
        order = sorted(plan.buffers, key=lambda b: (plan.sizes[b.name] == 0,
                                                    plan.offsets[b.name], b.name))
        position = {b.name: k for k, b in enumerate(order)}
        self._order = [(b.name, [position[p.name] for p in order[:k] if p.lives_with(b)])
                       for k, b in enumerate(order)]

    def at(self, nbytes: dict[str, int]) -> MemoryPlan:
        """The plan for these buffer sizes (bytes, by name)."""
        alignment = self.alignment
        sizes = {name: _aligned(nbytes[name], alignment) for name in nbytes}
        tops: list[int] = []
        offsets: dict[str, int] = {}
        for name, below in self._order:
            size = sizes[name]
            base = _aligned(max((tops[k] for k in below), default=0), alignment) if size else 0
            offsets[name] = base
            tops.append(base + size)
        total = max(tops, default=0)
        return MemoryPlan(offsets=offsets, sizes=sizes, total_bytes=total,
                          naive_bytes=sum(sizes.values()), alignment=alignment,
                          strategy="stacked", buffers=self.buffers)

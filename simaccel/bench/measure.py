"""Timing primitives shared by ``simaccel bench`` and ``bench/`` (pytest-benchmark).

All times are seconds (``time.perf_counter``) unless a name says otherwise.
"""
from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.utils import counters


#: Dynamo's recompile limits while benchmarking: backends that recompile per value must
#: keep recompiling (at the default of 8, Dynamo falls back to running eager).
RECOMPILE_LIMIT = 100_000

_LIMIT_NAMES = ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                "accumulated_cache_size_limit")


def compile_for(fn: Callable, backend: str, dynamic: bool | None = None,
                options: dict[str, Any] | None = None) -> Callable:
    """``fn`` compiled by ``backend`` (``fn`` itself for plain "eager")."""
    if backend == "eager":
        return fn
    name = "eager" if backend == "dynamo_eager" else backend
    return torch.compile(fn, backend=name, dynamic=dynamic, options=options)


@contextlib.contextmanager
def recompile_limits(limit: int = RECOMPILE_LIMIT) -> Iterator[None]:
    """Raise Dynamo's recompile limits to ``limit`` (graphs per frame), restore on exit."""
    config = torch._dynamo.config
    saved = {name: getattr(config, name) for name in _LIMIT_NAMES if hasattr(config, name)}
    try:
        for name in saved:
            # deprecated aliases share storage with the new names: set each one anyway
            setattr(config, name, limit)
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def fresh_dynamo() -> None:
    """Forget every compiled frame and zero Dynamo's counters."""
    torch._dynamo.reset()
    counters.clear()


def graphs_compiled() -> int:
    """Graphs Dynamo handed to a backend since the last :func:`fresh_dynamo`."""
    return int(counters["stats"]["unique_graphs"])


def time_call(fn: Callable, args: tuple) -> float:
    """Seconds of one call ``fn(*args)``."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def settle() -> None:
    """Wait for simaccel's kernels still compiling in the background (if simaccel is in
    use): a steady-state timing must not time their tier-0 forms, which run until the
    compile workers are done (seconds after the first call)."""
    simaccel = sys.modules.get("simaccel")
    if simaccel is not None:
        simaccel.wait_for_kernels()


def time_batches(fn: Callable, args: tuple, batches: int, batch: int) -> list[float]:
    """Mean seconds per call of each of ``batches`` batches of ``batch`` calls, once the
    background compiles are done (:func:`settle`).

    For calls of a few microseconds, where one ``perf_counter`` pair per call would be
    part of what is measured.
    """
    settle()
    return [_batch_seconds(fn, args, batch) for _ in range(batches)]


def time_batches_beside(fn: Callable, baseline: Callable, args: tuple, batches: int,
                        batch: int) -> tuple[list[float], list[float]]:
    """:func:`time_batches` of ``fn`` and of ``baseline``, batch for batch in alternating
    order (neither always runs on the warmer caches): the machine's load moves both, so
    their ratio holds where a separate process per backend, minutes apart, does not."""
    settle()
    ours: list[float] = []
    theirs: list[float] = []
    pairs = [(fn, ours), (baseline, theirs)]
    for k in range(batches):
        for f, times in (pairs if k % 2 == 0 else pairs[::-1]):
            times.append(_batch_seconds(f, args, batch))
    return ours, theirs


def _batch_seconds(fn: Callable, args: tuple, batch: int) -> float:
    """Mean seconds per call of ``batch`` calls ``fn(*args)`` timed together."""
    start = time.perf_counter()
    for _ in range(batch):
        fn(*args)
    return (time.perf_counter() - start) / batch


def batch_size_for(fn: Callable, args: tuple, budget_s: float = 2e-3) -> int:
    """Calls per batch so one batch takes about ``budget_s`` seconds (1..1000)."""
    settle()
    fn(*args)  # the first call after a kernel switched tiers binds its launches again
    once = max(time_call(fn, args), 1e-7)
    return max(1, min(1000, int(budget_s / once)))


def median(times: list[float]) -> float | None:
    """Median of ``times`` in seconds, ``None`` for no samples."""
    return statistics.median(times) if times else None


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Collect once, then keep the cyclic GC out of the timed region."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def guard_check_seconds(fn: Callable, f_locals: dict[str, Any], calls: int = 2000,
                        repeats: int = 7) -> float | None:
    """Seconds per evaluation of the guards of ``fn``'s newest compiled entry: the least
    over ``repeats`` timings of ``calls`` evaluations (a check of ~2 us is deterministic,
    so the least is its cost; one timing on the shared machine ranged 1.2-2.2 us).

    Reads Dynamo's debug accessor for a code object's cache entries; ``None`` when that
    accessor is missing (a torch without it) or nothing is compiled.
    """
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError:
        return None
    code = getattr(getattr(fn, "forward", fn), "__code__", None)
    entries = _debug_get_cache_entry_list(code) if code is not None else []
    if not entries:
        return None
    check = entries[0].guard_manager.check
    if not check(f_locals):
        return None
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            check(f_locals)
        best = min(best, time.perf_counter() - start)
    return best / calls


def device_counters() -> tuple[int, int]:
    """simaccel's (calls, kernel wall time in ns) so far in this process."""
    import simaccel

    stats = simaccel.get_device().runtime_stats()
    return stats["calls"], stats["kernel_wall_ns"]


def kernel_seconds_per_call(before: tuple[int, int]) -> float | None:
    """Mean host time simaccel's kernels took per call since ``before`` (seconds; DMA and
    per-call overhead excluded), or None if no call ran."""
    calls, wall_ns = device_counters()
    if calls == before[0]:
        return None
    return (wall_ns - before[1]) / (calls - before[0]) / 1e9

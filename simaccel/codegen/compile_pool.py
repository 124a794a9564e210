"""Parallel kernel compiles: the kernels a graph misses in the cache compile in worker
processes, which write the cache entries (numba's machine code and the native objects)
that this process then loads, exactly as it loads a kernel another process compiled.

numba compiles one function at a time per process (its compiler lock), and a cold graph
spends most of its first call there (``simaccel.compile_times()``: "kernels"). Workers are
forked from this process (Linux), so they start in milliseconds with simaccel and numba
already imported; they only compile (no torch, no kernel runs). The results are the same
files a serial compile writes (the same source, signature and compiler), and the kernel
cache's per-kernel lock keeps a worker and any other process from compiling one kernel
twice.

``SIMACCEL_COMPILE_WORKERS`` sets the number of workers (default: the CPU count, at most
4; ``0`` or ``1``: compile serially in this process). A graph with fewer than
:data:`MIN_JOBS` misses compiles serially while no workers run: starting them costs more
than the compiles save; once they run, two misses go to them (:func:`worth_sending`). A
worker that fails or dies is reported in the log and its kernels compile in this
process (where a real compile error then raises as usual).

Background compiles (kernels a graph's first call runs in tier 0, :mod:`.tiered`) are
*deferred*: queued when the graph is assembled and sent to the workers when that first call
returns (:func:`release_deferred`), when a launch has to wait for one, or
:data:`DEFER_S` after they were queued, whichever comes first. On a machine with as many
workers as cores, workers compiling during the first call take the cores its tier-0
kernels and library GEMMs run on (GPT-2's first-call launches: 0.06 s alone, 0.1-0.4 s
beside the workers); the compiles lose no more than that call's duration.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import logging
import multiprocessing
import os
import sys
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("simaccel.codegen")

#: fewest cache misses in one graph worth starting the workers for
MIN_JOBS = 3
#: fewest worth sending to workers already running: two compile side by side in about
#: half the time (two small kernels, 3 runs: 0.18-0.19 s one after the other here,
#: 0.095-0.098 s in the running workers; a round trip costs ~1 ms)
MIN_JOBS_RUNNING = 2
#: most workers by default (a compile is single-threaded; more rarely pays on a laptop)
DEFAULT_MAX_WORKERS = 4
#: seconds to wait for the workers' compiles of one graph before compiling here instead
TIMEOUT_S = 900.0

#: seconds a deferred background compile waits at most for the first call to return
DEFER_S = 2.0

_LOCK = threading.Lock()
_POOL: concurrent.futures.ProcessPoolExecutor | None = None
_POOL_WORKERS = 0


def worker_count() -> int:
    """Workers to compile with (``SIMACCEL_COMPILE_WORKERS``; 0: serial)."""
    value = os.environ.get("SIMACCEL_COMPILE_WORKERS")
    if value is not None and value.strip():
        try:
            return max(int(value), 0)
        except ValueError:
            log.warning("simaccel: SIMACCEL_COMPILE_WORKERS=%r is not an int; compiling "
                        "serially", value)
            return 0
    return min(os.cpu_count() or 1, DEFAULT_MAX_WORKERS)


def parallel() -> bool:
    """True if kernels compile in workers here (2 or more asked for, on Linux)."""
    return worker_count() >= 2 and sys.platform.startswith("linux")


def worth_sending(misses: int) -> bool:
    """Whether a graph's ``misses`` kernels to compile before its first call go to the
    workers (:data:`MIN_JOBS`, or :data:`MIN_JOBS_RUNNING` while they run)."""
    return parallel() and misses >= (MIN_JOBS_RUNNING if _POOL is not None else MIN_JOBS)


def precompile(root: Path, jobs: Sequence[tuple[str, tuple[str, ...]]]) -> set[str]:
    """Compile ``jobs`` ((source, signature) of kernels this process does not have) in the
    workers, writing them into the cache at ``root``; returns the sources a worker
    compiled (the rest compile or load in this process as usual)."""
    if not worth_sending(len(jobs)):
        return set()
    return collect(submit(root, jobs))


def submit(root: Path, jobs: Sequence[tuple[str, tuple[str, ...]]]
           ) -> dict[concurrent.futures.Future, str]:
    """Send ``jobs`` to the workers without waiting (in order: the pool is first in,
    first out); each future's result is the kernel's origin in the worker."""
    pool = _pool(worker_count())
    return {pool.submit(_compile, str(root), source, signature): source
            for source, signature in jobs}


class _Deferred:
    """Background compile jobs not yet sent to the workers: (our future, root, source,
    signature) in submission order; each future takes the worker's result once sent."""

    def __init__(self) -> None:
        #: (root None: a deferred load, :func:`defer_loads`)
        self.jobs: list[tuple[concurrent.futures.Future, Path | None, str,
                              tuple[str, ...]]] = []
        self.lock = threading.Lock()
        self.timer: threading.Timer | None = None
        #: the futures of deferred loads, made or completed (see :func:`defer_loads`)
        self.loads: weakref.WeakSet[concurrent.futures.Future] = weakref.WeakSet()


_DEFERRED = _Deferred()


def submit_deferred(root: Path, jobs: Sequence[tuple[str, tuple[str, ...]]]
                    ) -> dict[concurrent.futures.Future, str]:
    """Like :func:`submit`, but the jobs reach the workers only at :func:`release_deferred`
    (or :data:`DEFER_S` later); each future's result is the kernel's origin."""
    futures = {}
    with _DEFERRED.lock:
        for source, signature in jobs:
            future: concurrent.futures.Future = concurrent.futures.Future()
            _DEFERRED.jobs.append((future, root, source, signature))
            futures[future] = source
        _start_timer()
    return futures


def is_deferred_load(future: Any) -> bool:
    """True for a future :func:`defer_loads` made."""
    return future in _DEFERRED.loads


def defer_loads(sources: Sequence[str]) -> dict[concurrent.futures.Future, str]:
    """Futures that complete with ``"disk"`` at :func:`release_deferred`, like deferred
    jobs but sent to no worker: kernels already in the cache that only numba can load
    (its import alone is ~0.5 s), so that a warm process's first call runs them in tier 0
    and loads them after it returns, as a cold process does with its compiles."""
    futures = {}
    with _DEFERRED.lock:
        for source in sources:
            future: concurrent.futures.Future = concurrent.futures.Future()
            _DEFERRED.jobs.append((future, None, source, ()))
            _DEFERRED.loads.add(future)
            futures[future] = source
        _start_timer()
    return futures


def _start_timer() -> None:
    """Release the deferred jobs :data:`DEFER_S` from now unless a timer runs (under
    ``_DEFERRED.lock``)."""
    if _DEFERRED.timer is None and _DEFERRED.jobs:
        _DEFERRED.timer = threading.Timer(DEFER_S, release_deferred)
        _DEFERRED.timer.daemon = True
        _DEFERRED.timer.start()


def release_deferred() -> int:
    """Send every deferred job to the workers (in the order queued; a deferred load
    completes here); returns how many jobs were sent."""
    with _DEFERRED.lock:
        queued, _DEFERRED.jobs = _DEFERRED.jobs, []
        timer, _DEFERRED.timer = _DEFERRED.timer, None
    if timer is not None:
        timer.cancel()
    for future, root, _, _ in queued:
        if root is None and not future.done():
            future.set_result("disk")
    jobs = [job for job in queued if job[1] is not None]
    if not jobs:
        return 0
    try:
        pool = _pool(worker_count())
        for future, root, source, signature in jobs:
            _chain(pool.submit(_compile, str(root), source, signature), future)
    except Exception as exc:  # noqa: BLE001 - no pool (shut down at exit, broken)
        for future, *_ in jobs:  # a waiting launch then compiles the kernel here
            if not future.done():
                future.set_exception(exc)
    return len(jobs)


def _chain(source: concurrent.futures.Future, target: concurrent.futures.Future) -> None:
    """Complete ``target`` with ``source``'s result or exception when it completes."""
    def done(f: concurrent.futures.Future) -> None:
        if target.done():  # failed already (the pool broke while the jobs were sent)
            return
        if f.cancelled():
            target.cancel()
        elif f.exception() is not None:
            target.set_exception(f.exception())
        else:
            target.set_result(f.result())
    source.add_done_callback(done)


def collect(futures: dict[concurrent.futures.Future, str]) -> set[str]:
    """Wait for ``futures`` (from :func:`submit`); the sources a worker compiled. A
    failed job is logged (this process compiles it when it loads it)."""
    compiled: set[str] = set()
    try:
        for future in concurrent.futures.as_completed(futures, timeout=TIMEOUT_S):
            try:
                if future.result() == "compiled":
                    compiled.add(futures[future])
            except Exception as exc:  # this process compiles it again and raises there
                log.warning("simaccel: a compile worker failed (%s); compiling that kernel "
                            "in this process", exc)
    except (concurrent.futures.TimeoutError, concurrent.futures.process.BrokenProcessPool) \
            as exc:
        log.warning("simaccel: the compile workers stopped (%s); compiling the rest of the "
                    "graph's kernels in this process", type(exc).__name__)
        shutdown(stuck=True)
    return compiled


def _pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    """The process's pool of ``workers`` workers (made at the first parallel compile, made
    again if ``SIMACCEL_COMPILE_WORKERS`` changed)."""
    global _POOL, _POOL_WORKERS
    with _LOCK:
        if _POOL is None or _POOL_WORKERS != workers:
            if _POOL is not None:
                _POOL.shutdown(wait=False, cancel_futures=True)
            _POOL = concurrent.futures.ProcessPoolExecutor(
                max_workers=workers, mp_context=multiprocessing.get_context("fork"))
            _POOL_WORKERS = workers
        return _POOL


def shutdown(stuck: bool = False, finish_sent: bool = False) -> None:
    """Stop the workers (they are started again by the next parallel compile); ``stuck``:
    they timed out or broke, so they are terminated rather than waited for;
    ``finish_sent``: they first compile every job already sent (at exit: the kernels
    compiling in the background for tier-0 launches are the next process's warm cache)."""
    global _POOL, _POOL_WORKERS
    if finish_sent:  # the deferred jobs count as sent: the next process's warm cache
        release_deferred()
    with _LOCK:
        pool, _POOL, _POOL_WORKERS = _POOL, None, 0
    if pool is None:
        return
    if stuck:  # the executor has no public kill; its worker processes are a dict
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
    pool.shutdown(wait=not stuck, cancel_futures=not finish_sent)


atexit.register(shutdown, finish_sent=True)  # before interpreter teardown, not in the executor's weakref


def _compile(root: str, source: str, signature: tuple[str, ...]) -> str:
    """In a worker: compile (or find) one kernel in the cache at ``root``; its origin."""
    from simaccel.codegen.cache import KernelCache
    return KernelCache(Path(root)).load(source, signature).origin

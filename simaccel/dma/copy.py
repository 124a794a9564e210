"""How the simulator moves a descriptor's bytes on this host.

Small copies run inline (the tensors of a steady call are tiny and any hand-off would
cost more than the copy). Large contiguous copies are split into one slice per host core
and copied concurrently -- numpy releases the GIL while it copies -- much as a DMA engine
spreads a large transfer over its queues. Only the host time changes: the simulated timing
of a descriptor is the engine's business and does not depend on how the bytes were moved.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

#: copies of at least this many bytes are split over the host cores (bytes). Below it,
#: waking a worker thread costs more than it saves.
PARALLEL_COPY_BYTES = 4 << 20
#: slices a large copy is split into (the host cores this process may run on, at most 4:
#: memory bandwidth, not cores, limits a copy beyond that)
COPY_WORKERS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                          else (os.cpu_count() or 1)))

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def copy_array(src: np.ndarray, dst: np.ndarray, staged: bool = False, label: str = "") -> None:
    """Copy ``src`` into ``dst`` in C order (``dst`` may have another shape with the same
    element count); through a contiguous bounce buffer when ``staged``. DMA moves bytes and
    never converts, so the dtypes must be equal."""
    if src.dtype != dst.dtype or src.size != dst.size:
        raise ValueError(f"DMA copy {label!r}: src {src.dtype}[{src.size}] does not match "
                         f"dst {dst.dtype}[{dst.size}] (same dtype and element count needed)")
    if staged:
        # The bounce buffer is a contiguous host copy; the device DMA then reads it.
        src = np.ascontiguousarray(src)
    if dst.nbytes >= PARALLEL_COPY_BYTES and COPY_WORKERS > 1 \
            and src.flags.c_contiguous and dst.flags.c_contiguous:
        _copy_in_slices(src.reshape(-1), dst.reshape(-1), COPY_WORKERS)
    elif src.shape == dst.shape:
        # Plain assignment is the cheapest copy numpy has for small arrays; with equal
        # dtypes it never converts.
        dst[...] = src
    elif dst.flags.c_contiguous:  # a view of dst: a strided src is gathered once
        dst.reshape(src.shape)[...] = src
    else:
        dst[...] = src.reshape(dst.shape)


def _copy_in_slices(src: np.ndarray, dst: np.ndarray, parts: int) -> None:
    """Copy flat ``src`` into flat ``dst`` as ``parts`` slices, one on this thread and the
    others on the worker pool; returns when every slice is done (a failure is re-raised)."""
    step = -(-src.size // parts)
    pool = _worker_pool()
    futures = [pool.submit(np.copyto, dst[lo:lo + step], src[lo:lo + step])
               for lo in range(step, src.size, step)]
    try:
        np.copyto(dst[:step], src[:step])
    finally:
        for future in futures:
            future.result()


def _worker_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(COPY_WORKERS - 1, thread_name_prefix="simaccel-dma")
    return _pool

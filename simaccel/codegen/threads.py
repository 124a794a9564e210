"""numba's kernel threads, started once without touching PyTorch's thread count.

numba's ``omp`` threading layer and PyTorch's intra-op pool share one OpenMP runtime. When
numba starts its threads inside the first compile or launch of a prange kernel, the
runtime's thread count becomes numba's (measured: ``torch.set_num_threads(1)``, then a
first prange kernel: ``torch.get_num_threads()`` reads 2). A user's thread setting was
lost, and when that compile ran under Dynamo, Dynamo stopped with "Global num_threads
state changed while dynamo tracing". Starting numba's threads here, explicitly, and
putting PyTorch's count back keeps both.
"""
from __future__ import annotations

import threading

_started = False
_lock = threading.Lock()


def start_kernel_threads() -> None:
    """Start numba's threads now (once per process), keeping ``torch.get_num_threads()``."""
    global _started
    if _started:
        return
    with _lock:
        if _started:
            return
        import torch
        from numba.np.ufunc import parallel

        count = torch.get_num_threads()
        parallel._launch_threads()
        if torch.get_num_threads() != count:
            torch.set_num_threads(count)
        _started = True

"""The GEMM of the BLAS PyTorch is built with, found without numba: kernel templates call
it on device buffers (:mod:`.blas_lib`), as a GPU kernel calls cuBLAS's device GEMM from
inside a fused kernel.

PyTorch's x86 wheels link MKL into ``libtorch_cpu`` and export its Fortran-convention
``sgemm_`` and ``dgemm_`` (every argument by address). numpy's or scipy's OpenBLAS is not
used: inside a parallel kernel its own thread pool fights numba's for the cores
(OpenBLAS warns "Detect OpenMP Loop" and a 4x8x128x64 attention took 6x longer). MKL,
sharing the OpenMP runtime PyTorch loaded, runs single-threaded inside numba's OpenMP
threads; under numba's other threading layers (TBB, workqueue) it would start a team of
its own in every task, so each task sets MKL's thread-local thread count to 1 while it
runs (``MKL_Set_Num_Threads_Local``, also exported) and restores it after: the GEMM is
used only where that control exists.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

#: dtype -> (the BLAS routine, the name kernels link it under)
GEMM_ROUTINES = {"float32": ("sgemm_", "simaccel_sgemm"),
                 "float64": ("dgemm_", "simaccel_dgemm")}

#: MKL's thread-local thread count (C convention: ``int f(int)``, returns the previous
#: count, 0 for "the global one"), and the name kernels link it under
THREADS_ROUTINE = ("MKL_Set_Num_Threads_Local", "simaccel_blas_threads_local")


@functools.cache
def _torch_library() -> ctypes.CDLL | None:
    """PyTorch's CPU library (loaded already where torch is imported), or None."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    for path in sorted((Path(spec.origin).parent / "lib").glob("libtorch_cpu.*")):
        try:
            return ctypes.CDLL(str(path))
        except OSError:
            continue
    return None


@functools.cache
def _address(routine: str) -> int | None:
    """The address of ``routine`` in PyTorch's library, or None if it exports none."""
    library = _torch_library()
    function = getattr(library, routine, None) if library is not None else None
    return None if function is None else ctypes.cast(function, ctypes.c_void_p).value


@functools.cache
def gemm_addresses() -> dict[str, int]:
    """dtype -> address of its GEMM routine, for the dtypes PyTorch's library exports one
    (none without :data:`THREADS_ROUTINE`: see the module's docstring)."""
    if threads_address() is None:
        return {}
    found = {dtype: _address(routine) for dtype, (routine, _) in GEMM_ROUTINES.items()}
    return {dtype: address for dtype, address in found.items() if address is not None}


def threads_address() -> int | None:
    """The address of :data:`THREADS_ROUTINE`, or None."""
    return _address(THREADS_ROUTINE[0])


def has_gemm(dtype: str) -> bool:
    """True if kernels can call a BLAS GEMM in ``dtype`` (a numpy dtype name)."""
    return dtype in gemm_addresses()

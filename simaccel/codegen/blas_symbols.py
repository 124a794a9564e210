"""The GEMM of the BLAS PyTorch is built with, found without numba: kernel templates call
it on device buffers (:mod:`.blas_lib`), as a GPU kernel calls cuBLAS's device GEMM from
inside a fused kernel.

PyTorch's x86 wheels link MKL into ``libtorch_cpu`` and export its Fortran-convention
``sgemm_`` and ``dgemm_`` (every argument by address). numpy's or scipy's OpenBLAS is not
used: inside a parallel kernel its own thread pool fights numba's for the cores
(OpenBLAS warns "Detect OpenMP Loop" and a 4x8x128x64 attention took 6x longer), while
MKL, sharing the OpenMP runtime PyTorch loaded, runs single-threaded in each of numba's
threads.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

#: dtype -> (the BLAS routine, the name kernels link it under)
GEMM_ROUTINES = {"float32": ("sgemm_", "simaccel_sgemm"),
                 "float64": ("dgemm_", "simaccel_dgemm")}


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
def gemm_addresses() -> dict[str, int]:
    """dtype -> address of its GEMM routine, for the dtypes PyTorch's library exports one."""
    library = _torch_library()
    found = {}
    for dtype, (routine, _) in GEMM_ROUTINES.items():
        function = getattr(library, routine, None) if library is not None else None
        if function is not None:
            found[dtype] = ctypes.cast(function, ctypes.c_void_p).value
    return found


def has_gemm(dtype: str) -> bool:
    """True if kernels can call a BLAS GEMM in ``dtype`` (a numpy dtype name)."""
    return dtype in gemm_addresses()

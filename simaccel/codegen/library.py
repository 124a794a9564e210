"""Library kernels: device operations that run as one call into a tuned library on
device buffers, instead of generated code.

This is how a real backend runs a GEMM: inductor emits an ``extern_kernels.mm`` call,
a GPU backend a cuBLAS call. Here the library is PyTorch's CPU BLAS (``torch.mm`` /
``torch.bmm`` with ``out=``) on tensors that view device memory, so nothing is copied
and nothing needs a JIT compile. (numpy's OpenBLAS was measured too: slower on the MLP
shapes, and its thread pool fights torch's for the cores.) A library kernel is still a
device kernel launch (:class:`~simaccel.codegen.ir.LibraryKernel`): it becomes a
:class:`~simaccel.runtime.spec.LaunchStep`, counts
in ``kernel_launches`` and sits on the compute track with its roofline time. Epilogues
(bias, activation) stay fused in the pointwise kernel that follows.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

#: dtypes the GEMM runs in the BLAS library (others use the matmul template).
GEMM_DTYPES = ("float32", "float64")


def _matrices(buf: np.ndarray, offset: int, batch: int, rows: int, cols: int,
              batch_stride: int, transposed: bool) -> np.ndarray:
    """A (batch, rows, cols) view of the flat ``buf`` from element ``offset``: row-major
    matrices, or column-major ones (``transposed``) that BLAS reads without a copy."""
    item = buf.itemsize
    inner = (item, rows * item) if transposed else (cols * item, item)
    return np.ndarray((batch, rows, cols), buf.dtype, buf, offset * item,
                      (batch_stride * item, *inner))


class Gemm:
    """``out[i] = a[i] @ b[i]`` for ``i < batch`` (elements; batch strides may be 0 for a
    broadcast operand); ``out`` is contiguous (batch, m, n) from element 0.

    Called as ``gemm(out, a, b, batch, m, k, n, a_off, a_bs, b_off, b_bs, a_t, b_t)``.
    A program binds each launch once per workspace and size tuple (:meth:`bind`): the
    tensors viewing the device buffers are made then, so a launch is the BLAS call alone
    (making the three views costs ~10-20 us, as much as a small GEMM's own time)."""

    def __init__(self) -> None:
        self.__qualname__ = "gemm"

    def __call__(self, *args: Any) -> None:
        self.bind(*args)()

    def bind(self, out: np.ndarray, a: np.ndarray, b: np.ndarray, batch: int, m: int,
             k: int, n: int, a_off: int, a_bs: int, b_off: int, b_bs: int, a_t: int,
             b_t: int, addresses: Any = None) -> Callable[[], Any]:
        """The launch on these buffers as a zero-argument call (``addresses``: unused;
        the tensors keep their arrays, so their memory stays alive while it is bound)."""
        if m == 0 or n == 0 or batch == 0:
            return _nothing
        o = torch.from_numpy(out[:batch * m * n].reshape(batch, m, n))
        if k == 0:
            return o.zero_
        lhs = torch.from_numpy(_matrices(a, a_off, batch, m, k, a_bs, bool(a_t)))
        rhs = torch.from_numpy(_matrices(b, b_off, batch, k, n, b_bs, bool(b_t)))
        if batch == 1:
            return functools.partial(torch.mm, lhs[0], rhs[0], out=o[0])
        return functools.partial(torch.bmm, lhs, rhs, out=o)


def _nothing() -> None:
    """An empty GEMM's launch."""


gemm = Gemm()

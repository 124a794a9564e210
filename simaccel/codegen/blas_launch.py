"""A 2-D library GEMM launched by the BLAS routine itself, on data addresses.

``torch.mm`` on float32 and float64 CPU tensors calls the BLAS PyTorch is built with
(MKL's ``sgemm_`` / ``dgemm_``, :mod:`.blas_symbols`), so calling that routine on the
device buffers' addresses runs the same product on the same threads. What changes is
what a patch costs: a launch writing a host-mapped output (a training backward's weight
gradient, a new tensor every step) is re-pointed at the new array by storing its address
(~0.1 us), where ``torch.mm(out=)`` needs a new tensor view and call (~11 us measured
inside the MLP training step, two per step), as a CUDA graph's kernel node takes new
parameters without being captured again. A launch also offers its call as command-list
entries (:mod:`.commands`), so a replay runs it inside one native call with the kernels
around it (:mod:`simaccel.runtime.sequence`).
"""
from __future__ import annotations

import ctypes

import numpy as np

from simaccel.codegen.blas_symbols import gemm_addresses
from simaccel.codegen.commands import ROWS, VOID, command_list

#: the largest size or leading dimension the routine takes (LP64: 32-bit ints)
_INT_MAX = 2 ** 31 - 1


class BlasGemmLaunch:
    """``out = a @ b`` (row-major ``out`` (m, n); ``a`` (m, k) and ``b`` (k, n) row- or
    column-major from element offsets ``a_off`` / ``b_off``) as one BLAS call: the
    column-major product ``out.T = b.T @ a.T`` on the buffers' addresses. Positions as
    :class:`~simaccel.codegen.library.GemmLaunch`'s: 0 out, 1 a, 2 b."""

    __slots__ = ("_fn", "_args", "_pointers", "_offsets", "_kept", "commands")

    #: :meth:`patch` stores the address alone (the array is only kept alive)
    patched_by_address = True

    #: builds a command list of launches' ``commands`` (:mod:`simaccel.runtime.sequence`)
    build_commands = staticmethod(command_list)

    def __init__(self, address: int, params: tuple[int, ...], arrays: tuple[np.ndarray, ...],
                 beta: float = 0.0):
        _, m, k, n, a_off, _, b_off, _, a_t, b_t = params
        itemsize = arrays[0].itemsize
        #: bytes from each array's first element to its operand's: out, a, b
        self._offsets = (0, a_off * itemsize, b_off * itemsize)
        self._pointers = [ctypes.c_void_p(array.ctypes.data + offset)
                          for array, offset in zip(arrays, self._offsets)]
        self._kept = list(arrays)
        scalar = ctypes.c_float if itemsize == 4 else ctypes.c_double
        # (transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) by address
        values = [ctypes.c_char(b"T" if b_t else b"N"), ctypes.c_char(b"T" if a_t else b"N"),
                  ctypes.c_int(n), ctypes.c_int(m), ctypes.c_int(k), scalar(1.0),
                  self._pointers[2], ctypes.c_int(k if b_t else n), self._pointers[1],
                  ctypes.c_int(m if a_t else k), scalar(beta), self._pointers[0],
                  ctypes.c_int(n)]
        self._args = tuple(v if isinstance(v, ctypes.c_void_p) else ctypes.byref(v)
                           for v in values)
        self._fn = ctypes.CFUNCTYPE(None)(address)
        #: the call as a command-list entry: every argument an address, the scalars' where
        #: they live (kept alive by ``_args``), the operands' read from their pointers
        self.commands: tuple = ((address, tuple(
            v if isinstance(v, ctypes.c_void_p) else ctypes.c_void_p(ctypes.addressof(v))
            for v in values), VOID),)

    def __call__(self) -> None:
        self._fn(*self._args)

    def patch(self, position: int, array: np.ndarray, address: int) -> None:
        """Point buffer argument ``position`` at ``array`` (data address ``address``,
        bytes), of the dtype and size the launch was bound with (checked by the
        caller): one address stored."""
        self._pointers[position].value = address + self._offsets[position]
        self._kept[position] = array


class BlasGemmBiasLaunch(BlasGemmLaunch):
    """``out = bias + a @ b`` (``bias`` a row of ``n``, position 3) as torch.addmm runs it:
    the bias copied into every row of ``out``, then the BLAS product added to it (beta
    1), so it is rounded once."""

    __slots__ = ("_rows", "_bias", "_bias_pointer")

    #: :meth:`patch` keeps views of the output's rows and of the bias
    patched_by_address = False

    def __init__(self, address: int, params: tuple[int, ...], arrays: tuple[np.ndarray, ...]):
        super().__init__(address, params, arrays[:3], beta=1.0)
        m, n = params[1], params[3]
        self._rows = arrays[0][:m * n].reshape(m, n)
        self._bias = arrays[3][:n]
        self._bias_pointer = ctypes.c_void_p(arrays[3].ctypes.data)
        # the bias copy as a command-list entry: the bias row into each of out's m rows
        rows = (self._pointers[0], self._bias_pointer, ctypes.c_int64(m),
                ctypes.c_int64(n * arrays[0].itemsize))
        self.commands = ((0, rows, ROWS), *self.commands)

    def __call__(self) -> None:
        self._rows[...] = self._bias
        self._fn(*self._args)

    def patch(self, position: int, array: np.ndarray, address: int) -> None:
        """As :meth:`BlasGemmLaunch.patch`; the output's rows and the bias are views."""
        if position == 3:
            self._bias = array[:self._bias.size]
            self._bias_pointer.value = address  # the view keeps the array alive
            return
        if position == 0:
            self._rows = array[:self._rows.size].reshape(self._rows.shape)
        super().patch(position, array, address)


def blas_launch(params: tuple[int, ...], arrays: tuple[np.ndarray, ...]
                ) -> BlasGemmLaunch | None:
    """The :class:`BlasGemmLaunch` of a GEMM with ``params`` (``batch, m, k, n, a_off,
    a_bs, b_off, b_bs, a_t, b_t``) on ``arrays`` (out, a, b; a fourth, the bias row:
    :class:`BlasGemmBiasLaunch`), or None where it is not one product of a positive
    ``k`` in a dtype the BLAS has, within its int range."""
    batch, m, k, n = params[:4]
    dtype = arrays[0].dtype
    address = gemm_addresses().get(dtype.name)
    if (address is None or batch != 1 or k <= 0 or max(m, k, n) > _INT_MAX
            or any(a.dtype != dtype for a in arrays)):
        return None
    if len(arrays) == 4:
        return BlasGemmBiasLaunch(address, params, arrays)
    return BlasGemmLaunch(address, params, arrays)

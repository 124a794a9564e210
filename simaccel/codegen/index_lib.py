"""Index bound checks of gather and scatter kernels, re-exported by :mod:`.kernel_lib`
(kernels name them ``lib.index_outside`` and ``lib.clamped_index``), see
:func:`simaccel.codegen.emit.with_index_check`."""
from __future__ import annotations

import numba

_jit = numba.njit(cache=True, inline="always", error_model="numpy", fastmath=False)


@_jit
def index_outside(i, n):
    """1 if index ``i`` (of a gather or scatter, wrapped from Python's negative form
    already) is outside a dimension of ``n``, else 0: a kernel counts these and raises
    after its loops (a raise inside a prange loop would keep numba from parallelising
    it), see :func:`simaccel.codegen.emit.with_index_check`."""
    return 1 if i < 0 or i >= n else 0


@_jit
def clamped_index(i, n):
    """``i`` where it is inside a dimension of ``n``, else 0: the kernel reads or writes
    inside its buffer until it raises for the counted bad index."""
    return i if 0 <= i < n else 0

"""The integer functions of size expressions, for generated kernels.

A kernel over dynamic sizes names them in its source as sympy prints them (``Max(s0, 1)``,
``Mod(s1, 4)``); these are the same functions as the runtime's
(:data:`simaccel.runtime.sizes.SIZE_FUNCTIONS`), compiled by numba and inlined.
"""
from __future__ import annotations

import numba

from simaccel.runtime.sizes import SIZE_FUNCTIONS

_jit = numba.njit(cache=True, inline="always")

FloorDiv = _jit(SIZE_FUNCTIONS["FloorDiv"])
CleanDiv = _jit(SIZE_FUNCTIONS["CleanDiv"])
Mod = _jit(SIZE_FUNCTIONS["Mod"])
PythonMod = _jit(SIZE_FUNCTIONS["PythonMod"])
ModularIndexing = _jit(SIZE_FUNCTIONS["ModularIndexing"])


@_jit
def Max(a, b):  # noqa: N802 - sympy's name
    return a if a > b else b


@_jit
def Min(a, b):  # noqa: N802 - sympy's name
    return a if a < b else b


ToFloat = _jit(SIZE_FUNCTIONS["ToFloat"])
FloatTrueDiv = _jit(SIZE_FUNCTIONS["FloatTrueDiv"])
IntTrueDiv = _jit(SIZE_FUNCTIONS["IntTrueDiv"])
FloatPow = _jit(SIZE_FUNCTIONS["FloatPow"])
OpaqueUnaryFn_sqrt = _jit(SIZE_FUNCTIONS["OpaqueUnaryFn_sqrt"])

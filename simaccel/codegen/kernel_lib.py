"""Scalar helper functions that generated kernels call.

Each is a ``numba.njit`` function so it inlines into the kernels that use it, and
a plain Python function under ``NUMBA_DISABLE_JIT=1``. They reproduce PyTorch's
CPU semantics where Python's or numba's differ (NaN propagation, floor division
and remainder of floats, signs).
"""
from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

_jit = numba.njit(cache=True, inline="always", error_model="numpy")


def maximum(a, b):
    """torch.maximum: NaN if either operand is NaN. In kernels, floats lower to LLVM's
    ``llvm.maximum`` (branch-free, so max reductions vectorise)."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a > b else b


def minimum(a, b):
    """torch.minimum: NaN if either operand is NaN (``llvm.minimum`` in kernels)."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a < b else b


def _llvm_float_binary(name: str):
    """An intrinsic calling ``llvm.<name>.f32/f64`` on two floats of the same type."""
    @intrinsic
    def call(typingctx, a, b):
        def codegen(context, builder, signature, args):
            bits = 32 if signature.args[0] == types.float32 else 64
            fnty = ir.FunctionType(args[0].type, [args[0].type, args[1].type])
            fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.{name}.f{bits}")
            return builder.call(fn, args)
        return a(a, b), codegen
    return call


_llvm_maximum = _llvm_float_binary("maximum")
_llvm_minimum = _llvm_float_binary("minimum")


@overload(maximum, jit_options={"cache": True})
def _maximum_impl(a, b):
    if isinstance(a, types.Float) and a == b:
        return lambda a, b: _llvm_maximum(a, b)
    return lambda a, b: a if (a != a or a > b) else b


@overload(minimum, jit_options={"cache": True})
def _minimum_impl(a, b):
    if isinstance(a, types.Float) and a == b:
        return lambda a, b: _llvm_minimum(a, b)
    return lambda a, b: a if (a != a or a < b) else b


@_jit
def fmax(a, b):
    """torch.fmax: NaN only if both are NaN."""
    if a != a:
        return b
    if b != b:
        return a
    return a if a > b else b


@_jit
def fmin(a, b):
    if a != a:
        return b
    if b != b:
        return a
    return a if a < b else b


@_jit
def sign(a):
    if a > 0:
        return 1
    if a < 0:
        return -1
    return 0


@_jit
def float_remainder(a, b):
    """torch.remainder on floats: the result has the sign of the divisor."""
    mod = np.fmod(a, b)  # numba has no math.fmod
    if mod != 0 and ((b < 0) != (mod < 0)):
        mod += b
    return mod


@_jit
def float_floor_divide(a, b):
    """torch.div(..., rounding_mode="floor") on floats (c10::div_floor_floating)."""
    if b == 0:
        return a / b
    mod = np.fmod(a, b)
    div = (a - mod) / b
    if mod != 0 and ((b < 0) != (mod < 0)):
        div -= 1.0
    if div != 0:
        floordiv = np.floor(div)  # math.floor would return an integer
        if div - floordiv > 0.5:
            floordiv += 1.0
        return floordiv
    return math.copysign(0.0, a / b)


@_jit
def int_trunc_divide(a, b):
    """Integer division rounding toward zero (C semantics)."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


@_jit
def int_fmod(a, b):
    """Integer remainder with the sign of the dividend (C semantics)."""
    r = abs(a) % abs(b)
    return r if a >= 0 else -r


@_jit
def int_pow(a, b):
    """Integer power by squaring; negative exponents follow torch (0 unless |a| == 1)."""
    if b < 0:
        if a == 1:
            return 1
        if a == -1:
            return 1 if b % 2 == 0 else -1
        return 0
    result = 1
    while b:
        if b & 1:
            result *= a
        a *= a
        b >>= 1
    return result


@_jit
def sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


@_jit
def erf(a):
    return math.erf(a)


@_jit
def round_half_even(a):
    return np.rint(a)

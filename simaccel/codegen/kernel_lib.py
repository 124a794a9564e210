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

#: Options of every helper. ``fastmath`` is set explicitly: numba lets a callee that leaves
#: it unset inherit its caller's flags, and a helper first compiled from a reduction kernel
#: (reassoc) would then be cached with reassociated arithmetic for every later caller
#: (exp's round-to-nearest trick and Cody-Waite reduction depend on exact evaluation order).
_LIB_OPTIONS = {"cache": True, "fastmath": False, "error_model": "numpy"}

_jit = numba.njit(cache=True, inline="always", error_model="numpy", fastmath=False)


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


@overload(maximum, jit_options=_LIB_OPTIONS)
def _maximum_impl(a, b):
    if isinstance(a, types.Float) and a == b:
        return lambda a, b: _llvm_maximum(a, b)
    return lambda a, b: a if (a != a or a > b) else b


@overload(minimum, jit_options=_LIB_OPTIONS)
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


def sigmoid(a):
    """1 / (1 + exp(-a)); float32 through the vectorisable exp."""
    return 1.0 / (1.0 + np.exp(-a))


@overload(sigmoid, jit_options=_LIB_OPTIONS)
def _sigmoid_impl(a):
    return lambda a: 1.0 / (1.0 + vexp(-a))


@_jit
def round_half_even(a):
    return np.rint(a)


# --------------------------------------------------------------------------- vector math
# numba calls libm's expf/tanhf one element at a time (llvmlite has no vector math library),
# which stops LLVM from vectorising any loop that uses them. These float32 versions are
# plain arithmetic plus a bit cast (Cephes' expf/tanhf, ~1 ulp), so their loops vectorise.
# The Python bodies are the reference used under NUMBA_DISABLE_JIT.


@intrinsic
def _int32_as_float32(typingctx, i):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


def vexp(x):
    """exp(x): float32 without libm in kernels."""
    return np.exp(x)


def vtanh(x):
    """tanh(x): float32 without libm in kernels."""
    return np.tanh(x)


def _expf(x):
    f = np.float32
    xc = min(max(x, f(-104.0)), f(89.0))
    fx = (xc * f(1.44269504088896341) + f(12582912.0)) - f(12582912.0)  # round to nearest
    r = xc - fx * f(0.693359375) - fx * f(-2.12194440e-4)
    z = r * r
    p = f(1.9875691500e-4) * r + f(1.3981999507e-3)
    p = p * r + f(8.3334519073e-3)
    p = p * r + f(4.1665795894e-2)
    p = p * r + f(1.6666665459e-1)
    p = p * r + f(5.0000001201e-1)
    y = p * z + r + f(1.0)
    n = np.int32(fx)
    n1 = n >> np.int32(1)
    s1 = _int32_as_float32((n1 + np.int32(127)) << np.int32(23))
    s2 = _int32_as_float32((n - n1 + np.int32(127)) << np.int32(23))
    out = y * s1 * s2
    out = f(np.inf) if x > f(88.72283905206835) else out
    return x if x != x else out


def _tanhf(x):
    f = np.float32
    ax = abs(x)
    z = vexp(f(2.0) * ax)
    big = f(1.0) - f(2.0) / (z + f(1.0))
    big = -big if x < f(0.0) else big
    s = x * x
    p = f(-5.70498872745e-3) * s + f(2.06390887954e-2)
    p = p * s - f(5.37397155531e-2)
    p = p * s + f(1.33314422036e-1)
    p = p * s - f(3.33332819422e-1)
    small = p * s * x + x
    out = small if ax < f(0.625) else big
    return x if x != x else out


@overload(vexp, jit_options=_LIB_OPTIONS)
def _vexp_impl(x):
    if x == types.float32:
        return _expf
    return lambda x: np.exp(x)


@overload(vtanh, jit_options=_LIB_OPTIONS)
def _vtanh_impl(x):
    if x == types.float32:
        return _tanhf
    return lambda x: np.tanh(x)


def verf(x):
    """erf(x): float32 without libm in kernels."""
    return math.erf(x)


def _erff(x):
    # Eigen's float erf: a rational minimax fit on [-4, 4] (erf(4) == 1 in float32).
    f = np.float32
    xc = min(max(x, f(-4.0)), f(4.0))
    x2 = xc * xc
    p = f(-2.72614225801306e-10) * x2 + f(2.77068142495902e-08)
    p = p * x2 + f(-2.10102402082508e-06)
    p = p * x2 + f(-5.69250639462346e-05)
    p = p * x2 + f(-7.34990630326855e-04)
    p = p * x2 + f(-2.95459980854025e-03)
    p = p * x2 + f(-1.60960333262415e-02)
    q = f(-1.45660718464996e-05) * x2 + f(-2.13374055278905e-04)
    q = q * x2 + f(-1.68282697438203e-03)
    q = q * x2 + f(-7.37332916720468e-03)
    q = q * x2 + f(-1.42647390514189e-02)
    out = xc * p / q
    return x if x != x else out


@overload(verf, jit_options=_LIB_OPTIONS)
def _verf_impl(x):
    if x == types.float32:
        return _erff
    return lambda x: math.erf(x)

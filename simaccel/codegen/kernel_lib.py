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
from numba.extending import intrinsic, overload, register_jitable

from simaccel.codegen.fma_lib import LIB_OPTIONS as _LIB_OPTIONS
from simaccel.codegen.fma_lib import fma  # noqa: F401 - kernels call it as lib.fma
from simaccel.codegen import hash_lib as _hash_lib
from simaccel.codegen.loop_lib import opaque_extent  # noqa: F401 - as lib.opaque_extent
from simaccel.codegen.parfor_names import install as _install_parfor_names
from simaccel.codegen.numpy_lib import TRIG_FAST_LIMIT  # |x| where vsin/vcos are accurate

from simaccel.codegen.kernel_ext import *  # noqa: F401,F403  (16-bit floats, special functions)

_install_parfor_names()  # before any kernel's parallel loop is lowered (parfor_names)
# dropout's random bits (lib.random_bits), and the round it calls, compiled where called
register_jitable(_hash_lib.mix32)
random_bits = register_jitable(_hash_lib.random_bits)

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


def _llvm_float_binary(name: str, flags: tuple[str, ...] = ()):
    """An intrinsic calling ``llvm.<name>.f32/f64`` on two floats of the same type, with
    the fast-math ``flags`` on the call."""
    @intrinsic
    def call(typingctx, a, b):
        def codegen(context, builder, signature, args):
            bits = 32 if signature.args[0] == types.float32 else 64
            fnty = ir.FunctionType(args[0].type, [args[0].type, args[1].type])
            fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.{name}.f{bits}")
            return builder.call(fn, args, fastmath=flags)
        return a(a, b), codegen
    return call


_llvm_maximum = _llvm_float_binary("maximum")
_llvm_minimum = _llvm_float_binary("minimum")
_llvm_maximum_nsz = _llvm_float_binary("maximum", ("nsz",))
_llvm_minimum_nsz = _llvm_float_binary("minimum", ("nsz",))


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


def max_combine(a, b):
    """The combine step of max reductions: NaN if either operand is NaN, like maximum,
    but a zero result may be -0.0 or 0.0 whichever the operands' order (as in torch's own
    vectorised max reduction). Without the signed-zero ordering, LLVM lowers it to ~3
    instead of ~5 vector instructions per step."""
    return maximum(a, b)


def min_combine(a, b):
    """The combine step of min reductions (see max_combine)."""
    return minimum(a, b)


@overload(max_combine, jit_options=_LIB_OPTIONS)
def _max_combine_impl(a, b):
    if isinstance(a, types.Float) and a == b:
        return lambda a, b: _llvm_maximum_nsz(a, b)
    return lambda a, b: maximum(a, b)


@overload(min_combine, jit_options=_LIB_OPTIONS)
def _min_combine_impl(a, b):
    if isinstance(a, types.Float) and a == b:
        return lambda a, b: _llvm_minimum_nsz(a, b)
    return lambda a, b: minimum(a, b)


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
# plain arithmetic plus bit casts (Cephes' expf and logf ~1 ulp, Eigen's tanhf ~5 ulp and
# erff), so their loops vectorise. The Python bodies are the reference used under
# NUMBA_DISABLE_JIT.


@intrinsic
def _int32_as_float32(typingctx, i):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@intrinsic
def _float32_as_int32(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@intrinsic
def _muladd(typingctx, a, b, c):
    """a * b + c as ``llvm.fmuladd``: one fused multiply-add where the target has a fast
    one (one rounding instead of two), a multiply and an add elsewhere. Used for the
    Horner steps of polynomials only, where either rounding is within their error."""
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(args[0].type, [args[0].type] * 3)
        bits = 32 if signature.args[0] == types.float32 else 64
        fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.fmuladd.f{bits}")
        return builder.call(fn, args)
    return a(a, b, c), codegen


def _float32_overload(stub, float32_impl, other_impl):
    """Compile calls of ``stub`` in kernels as ``float32_impl`` (vectorisable arithmetic)
    for a float32 argument and as ``other_impl`` (libm through numpy) otherwise."""
    def typer(x):
        return float32_impl if x == types.float32 else other_impl
    overload(stub, jit_options=_LIB_OPTIONS)(typer)


def vexp(x):
    """exp(x): float32 without libm in kernels."""
    return np.exp(x)


def vtanh(x):
    """tanh(x): float32 without libm in kernels."""
    return np.tanh(x)


def _expf(x):
    f = np.float32
    # Below -104 the result rounds to 0. Those lanes compute exp(0) and take 0 at the
    # end: scaling them by 2**-150 makes denormals, a microcode assist per element on
    # x86 (a masked softmax, half its scores at finfo.min, ran its exps 2x slower).
    under = x < f(-104.0)
    xc = f(0.0) if under else min(x, f(89.0))
    fx = (xc * f(1.44269504088896341) + f(12582912.0)) - f(12582912.0)  # round to nearest
    r = xc - fx * f(0.693359375) - fx * f(-2.12194440e-4)
    z = r * r
    p = _muladd(f(1.9875691500e-4), r, f(1.3981999507e-3))
    p = _muladd(p, r, f(8.3334519073e-3))
    p = _muladd(p, r, f(4.1665795894e-2))
    p = _muladd(p, r, f(1.6666665459e-1))
    p = _muladd(p, r, f(5.0000001201e-1))
    y = _muladd(p, z, r) + f(1.0)
    n = np.int32(fx)
    n1 = n >> np.int32(1)
    s1 = _int32_as_float32((n1 + np.int32(127)) << np.int32(23))
    s2 = _int32_as_float32((n - n1 + np.int32(127)) << np.int32(23))
    out = y * s1 * s2
    out = f(np.inf) if x > f(88.72283905206835) else out
    out = f(0.0) if under else out
    return x if x != x else out


def _tanhf(x):
    # Eigen's float tanh: a rational minimax fit (odd degree 13 over even degree 6) on
    # [-c, c], c = 7.9053; within 5 ulp. One division and no exp: about half the cost
    # of 1 - 2 / (exp(2x) + 1) in a fused chain.
    f = np.float32
    c = f(7.90531110763549805)
    xc = min(max(x, -c), c)
    x2 = xc * xc
    p = _muladd(f(-2.76076847742355e-16), x2, f(2.00018790482477e-13))
    p = _muladd(p, x2, f(-8.60467152213735e-11))
    p = _muladd(p, x2, f(5.12229709037114e-08))
    p = _muladd(p, x2, f(1.48572235717979e-05))
    p = _muladd(p, x2, f(6.37261928875436e-04))
    p = _muladd(p, x2, f(4.89352455891786e-03))
    q = _muladd(f(1.19825839466702e-06), x2, f(1.18534705686654e-04))
    q = _muladd(q, x2, f(2.26843463243900e-03))
    q = _muladd(q, x2, f(4.89352518554385e-03))
    out = (p * xc) / q
    ax = abs(x)
    out = (f(1.0) if x > f(0.0) else f(-1.0)) if ax > f(9.1) else out  # rounds to +-1
    out = x if ax < f(0.0004) else out  # rounds to x (keeps -0.0 and subnormals)
    return x if x != x else out


_float32_overload(vexp, _expf, lambda x: np.exp(x))


_float32_overload(vtanh, _tanhf, lambda x: np.tanh(x))


def verf(x):
    """erf(x): float32 without libm in kernels."""
    return math.erf(x)


def _erff(x):
    # Eigen's float erf: a rational minimax fit on [-4, 4] (erf(4) == 1 in float32).
    f = np.float32
    xc = min(max(x, f(-4.0)), f(4.0))
    x2 = xc * xc
    p = _muladd(f(-2.72614225801306e-10), x2, f(2.77068142495902e-08))
    p = _muladd(p, x2, f(-2.10102402082508e-06))
    p = _muladd(p, x2, f(-5.69250639462346e-05))
    p = _muladd(p, x2, f(-7.34990630326855e-04))
    p = _muladd(p, x2, f(-2.95459980854025e-03))
    p = _muladd(p, x2, f(-1.60960333262415e-02))
    q = _muladd(f(-1.45660718464996e-05), x2, f(-2.13374055278905e-04))
    q = _muladd(q, x2, f(-1.68282697438203e-03))
    q = _muladd(q, x2, f(-7.37332916720468e-03))
    q = _muladd(q, x2, f(-1.42647390514189e-02))
    out = xc * p / q
    return x if x != x else out


_float32_overload(verf, _erff, lambda x: math.erf(x))


def vlog(x):
    """log(x): float32 without libm in kernels."""
    return np.log(x)


def _logf(x):
    # Cephes' logf (~1 ulp): x = m * 2**e with m in [sqrt(1/2), sqrt(2)), then
    # log(x) = log1p(m - 1) + e * log(2), log1p by a degree-9 polynomial.
    f, i32 = np.float32, np.int32
    sub = x < f(1.17549435e-38)  # subnormal (or zero/negative, fixed below): scale by 2**23
    xs = x * f(8388608.0) if sub else x
    bits = _float32_as_int32(xs)
    e = ((bits >> i32(23)) & i32(0xFF)) - (i32(149) if sub else i32(126))
    m = _int32_as_float32((bits & i32(0x007FFFFF)) | i32(0x3F000000))  # in [0.5, 1)
    low = m < f(0.707106781186547524)
    e = e - i32(1) if low else e
    m = (m + m if low else m) - f(1.0)
    z = m * m
    p = _muladd(f(7.0376836292e-2), m, f(-1.1514610310e-1))
    for c in (1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
              2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1):
        p = _muladd(p, m, f(c))
    fe = f(e)
    y = _muladd(f(-2.12194440e-4), fe, p * m * z) - f(0.5) * z
    out = _muladd(f(0.693359375), fe, m + y)
    out = f(-np.inf) if x == f(0.0) else out
    out = f(np.nan) if x < f(0.0) else out
    return x if not (x < f(np.inf)) else out  # +inf and NaN are their own log


_float32_overload(vlog, _logf, lambda x: np.log(x))


# --------------------------------------------------------------------------- sin / cos
# float32 sin and cos as SLEEF's u35 versions (xsinf/xcosf): reduce by pi with a 4-part
# Cody-Waite split whose first parts have few bits (so q * part is exact), then one odd
# polynomial on [-pi/2, pi/2]. Within 3 ulp for |x| < TRIG_FAST_LIMIT; beyond it the
# reduction loses bits, so kernels flag such arguments (trig_arg_wide) and recompute the
# whole kernel with libm (see emit.py): the fast loop stays free of calls and vectorises.

_ROUND_F32 = 12582912.0  # 1.5 * 2**23: adding it rounds a float32 to an integer
_INV_PI = 0.318309886183790671538
_TINY_SIN = 2.44140625e-4  # 2**-12: below it sin(x) rounds to x (and keeps -0.0 and subnormals)


def vsin(x):
    """sin(x): float32 without libm in kernels (accurate for |x| < TRIG_FAST_LIMIT)."""
    return np.sin(x)


def vcos(x):
    """cos(x): float32 without libm in kernels (accurate for |x| < TRIG_FAST_LIMIT)."""
    return np.cos(x)


def trig_arg_wide(x):
    """1 if ``x`` is finite and outside vsin/vcos' accurate range, else 0 (an int64, so
    a kernel can sum the flags in a vectorised or prange reduction)."""
    ax = abs(x)
    return np.int64((ax >= TRIG_FAST_LIMIT) & (ax < np.inf))


@_jit
def _sin_poly(d, s):
    """sin(d) for |d| <= pi/2, s = d * d (SLEEF u35 coefficients)."""
    f = np.float32
    u = _muladd(f(2.6083159809786593541503e-06), s, f(-0.0001981069071916863322258))
    u = _muladd(u, s, f(0.00833307858556509017944336))
    u = _muladd(u, s, f(-0.166666597127914428710938))
    return _muladd(s, u * d, d)


@_jit
def _reduce_pi(x, q):
    """x - q * pi, q an integer-valued float32 with |q * pi| < TRIG_FAST_LIMIT."""
    f = np.float32
    d = x - q * f(3.140625)
    d = d - q * f(0.0009670257568359375)
    d = d - q * f(6.2771141529083251953e-07)
    return d - q * f(1.2154201256553420762e-10)


def _sinf(x):
    f = np.float32
    t = x * f(_INV_PI) + f(_ROUND_F32)
    q = t - f(_ROUND_F32)  # rint(x / pi); its parity is the low bit of t
    d = _reduce_pi(x, q)
    d = -d if (_float32_as_int32(t) & np.int32(1)) else d
    out = _sin_poly(d, d * d)
    return x if abs(x) < f(_TINY_SIN) else out


def _cosf(x):
    # cos(x) = -sin(x - pi/2); with m = rint(x/pi - 1/2), d = x - (2m + 1) pi/2 and
    # cos(x) = (-1)**(m + 1) sin(d).
    f = np.float32
    t = (x * f(_INV_PI) - f(0.5)) + f(_ROUND_F32)
    m = t - f(_ROUND_F32)
    q = f(2.0) * m + f(1.0)
    d = _reduce_pi(x, q * f(0.5))
    d = d if (_float32_as_int32(t) & np.int32(1)) else -d
    return _sin_poly(d, d * d)


_float32_overload(vsin, _sinf, lambda x: np.sin(x))


_float32_overload(vcos, _cosf, lambda x: np.cos(x))


@overload(trig_arg_wide, jit_options=_LIB_OPTIONS)
def _trig_arg_wide_impl(x):
    limit = np.float32(TRIG_FAST_LIMIT) if x == types.float32 else TRIG_FAST_LIMIT

    def impl(x):
        ax = abs(x)
        return np.int64(ax >= limit) & np.int64(ax < np.inf)
    return impl


# --------------------------------------------------------------------------- reductions


def reassoc_add(a, b):
    """a + b. In kernels a float add that LLVM may reassociate, so that a sum reduction
    vectorises (one partial sum per lane, as PyTorch's own reductions) while the rest of
    the kernel keeps exact IEEE arithmetic (no kernel-wide fastmath)."""
    return a + b


@intrinsic
def _fadd_reassoc(typingctx, a, b):
    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1], flags=("reassoc",))
    return a(a, b), codegen


@overload(reassoc_add, jit_options=_LIB_OPTIONS)
def _reassoc_add_impl(a, b):
    if isinstance(a, types.Float) and a == b:
        return lambda a, b: _fadd_reassoc(a, b)
    return lambda a, b: a + b

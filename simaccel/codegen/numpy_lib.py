"""Whole-array versions of the kernel helpers, for tier-0 kernels (:mod:`.emit_numpy`).

A tier-0 kernel evaluates the same kernel IR as its numba twin, one numpy operation per
IR node over the whole iteration space, so it must round exactly as the compiled kernel
does. Every helper here is the array form of one in :mod:`.kernel_lib`,
:mod:`.half_lib` or :mod:`.fma_lib`, with the same arithmetic in the same dtypes:

* float32 vector math (exp, log, tanh, erf, sin, cos) is the same polynomial with the
  same constants; a fused multiply-add of float32 operands is computed exactly as a
  float64 product plus one rounding (the product of two float32 is exact in float64).
* NaN, signed-zero and integer-division rules follow the scalar helpers line by line.

* The ops the compiled kernels leave to libm (log1p, tan, atan2, float pow, float64 exp,
  ...) call the same C function per element (:func:`libm`): numpy's own ufuncs for them
  are numpy's SIMD math on CPUs it has loops for (on AVX-512, 1-4 ulp away from glibc on
  many arguments).

Floating-point warnings are off while a tier-0 kernel runs (:mod:`.tiered`), as in the
compiled kernels. What a tier-0 kernel cannot reproduce is absent (a float64 fused
multiply-add, the special functions): :mod:`.emit_numpy` then declines the kernel, which
waits for its compiled version. A libm op over more than LIBM_ELEMENTS elements raises
:class:`NeedsLibm` when it runs, and the launch waits likewise.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np

from simaccel.codegen.hash_lib import random_bits  # noqa: F401 - whole arrays as they are
from simaccel.errors import KernelIndexError

#: elements up to which a tier-0 kernel calls libm per element (~0.5 us each, so ~65 ms
#: at the limit); beyond it waiting for the compiled kernel is the cheaper way
LIBM_ELEMENTS = 1 << 17

_LIBM = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")


class NeedsLibm(Exception):
    """A tier-0 kernel reached more libm work than it does per element (LIBM_ELEMENTS);
    the launch waits for the compiled kernel (:mod:`.tiered`)."""


@functools.lru_cache(maxsize=128)
def _libm_ufunc(name: str, nin: int, single: bool) -> np.ufunc:
    """C's ``name`` (``namef`` if ``single``) as an object ufunc of ``nin`` arguments."""
    fn = getattr(_LIBM, name + ("f" if single else ""))
    ctype = ctypes.c_float if single else ctypes.c_double
    fn.restype, fn.argtypes = ctype, [ctype] * nin
    return np.frompyfunc(fn, nin, 1)


def libm(name: str, *args):
    """C's ``name`` over ``args`` elementwise, as the compiled kernel calls it: ``namef``
    on float32 arguments, ``name`` on float64 (numba's types: the arguments' result type,
    float64 for integers)."""
    arrays = np.broadcast_arrays(*[np.asarray(a) for a in args])
    dtype = np.result_type(*arrays)
    dtype = dtype if dtype in (np.float32, np.float64) else np.dtype(np.float64)
    if arrays[0].size > LIBM_ELEMENTS:
        raise NeedsLibm(f"{name} over {arrays[0].size} elements (more than {LIBM_ELEMENTS})")
    ufunc = _libm_ufunc(name, len(arrays), dtype == np.float32)
    out = ufunc(*[a.astype(dtype) for a in arrays])
    return np.asarray(out, dtype=object).astype(dtype)


def power(a, b):
    """``a ** b``: float pow is libm's, integer pow numpy's (the same in both tiers)."""
    if np.result_type(a, b).kind in "iub":
        return np.power(a, b)
    return libm("pow", a, b)


#: |x| below which the float32 sin/cos polynomials are accurate (SLEEF's TRIGRANGEMAXf);
#: kernel_lib takes it from here (this module imports no numba: a warm process runs
#: native kernels without it)
TRIG_FAST_LIMIT = 39000.0

f32, i32, u32 = np.float32, np.int32, np.uint32


# --------------------------------------------------------------------------- control flow


def checked_index(i, n):
    """An array of gather or scatter indices (wrapped from Python's negative form
    already) checked to lie inside a dimension of ``n``: the tier-0 form of the compiled
    kernels' count-and-raise check (:func:`simaccel.codegen.emit.with_index_check`)."""
    i = np.asarray(i)
    if i.size and ((i < 0) | (i >= n)).any():
        raise KernelIndexError("a tier-0 kernel")
    return i


def where(cond, a, b):
    """``a if cond else b`` elementwise (both sides are evaluated)."""
    return np.where(cond, a, b)


def logical_and(*values):
    out = np.asarray(values[0], dtype=bool)
    for v in values[1:]:
        out = np.logical_and(out, v)
    return out


def logical_or(*values):
    out = np.asarray(values[0], dtype=bool)
    for v in values[1:]:
        out = np.logical_or(out, v)
    return out


def logical_not(value):
    return np.logical_not(value)


def to_bool(value):
    """``bool(x)``: nonzero (NaN is True, as in Python)."""
    return np.asarray(value).astype(bool)


def smaller(a, b):
    """``min(a, b)`` of index arithmetic."""
    return np.minimum(a, b)


def larger(a, b):
    """``max(a, b)`` of index arithmetic."""
    return np.maximum(a, b)


# --------------------------------------------------------------------------- fused multiply-add


def _fma32(a, b, c):
    """float32 ``a * b + c`` rounded once: the product is exact in float64."""
    return f32(np.float64(a) * np.float64(b) + np.float64(c))


def fma(a, b, c):
    """lib.fma: fused for three float32 operands (float64 ones never reach here: see
    :func:`simaccel.codegen.emit_numpy.unsupported_reason`), else ``a * b + c``."""
    if all(np.asarray(v).dtype == np.float32 for v in (a, b, c)):
        return _fma32(a, b, c)
    return a * b + c


_muladd = _fma32  # llvm.fmuladd fuses on this machine's target (FMA units)


# --------------------------------------------------------------------------- comparisons


def maximum(a, b):
    return np.maximum(a, b)


def minimum(a, b):
    return np.minimum(a, b)


def fmax(a, b):
    return np.fmax(a, b)


def fmin(a, b):
    return np.fmin(a, b)


def sign(a):
    """1, -1 or 0 (NaN: 0, as the scalar helper's comparisons give)."""
    return np.where(a > 0, 1, np.where(a < 0, -1, 0))


# --------------------------------------------------------------------------- division


def float_remainder(a, b):
    mod = np.fmod(a, b)
    return np.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


def float_floor_divide(a, b):
    """As the scalar helper, whose ``div -= 1.0`` makes numba type ``div`` float64."""
    one, half = np.float64(1.0), np.float64(0.5)
    mod = np.fmod(a, b)
    div = ((a - mod) / b).astype(np.float64)
    div = np.where((mod != 0) & ((b < 0) != (mod < 0)), div - one, div)
    floordiv = np.floor(div)
    floordiv = np.where(div - floordiv > half, floordiv + one, floordiv)
    zero = np.copysign(np.zeros_like(div), a / b)
    out = np.where(div != 0, floordiv, zero)
    return np.where(b == 0, a / b, out)


def int_trunc_divide(a, b):
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) == (b < 0), q, -q)


def int_fmod(a, b):
    r = np.abs(a) % np.abs(b)
    return np.where(a >= 0, r, -r)


def int_pow(a, b):
    """Integer power by squaring, elementwise; negative exponents as the scalar helper."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
    result = np.ones_like(a)
    base, exp = a.copy(), np.maximum(b, 0)
    while exp.any():
        odd = (exp & 1).astype(bool)
        result = np.where(odd, result * base, result)
        base = base * base
        exp = exp >> 1
    negative = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
    return np.where(b < 0, negative, result)


def round_half_even(a):
    return np.rint(a)


# --------------------------------------------------------------------------- vector math


def _float32(x) -> bool:
    return np.asarray(x).dtype == np.float32


def _as_float32(i):
    return np.asarray(i, dtype=np.int32).view(np.float32)


def _as_int32(x):
    return np.asarray(x, dtype=np.float32).view(np.int32)


def _expf(x):
    under = x < f32(-104.0)  # rounds to 0: computed as exp(0), no denormals (kernel_lib)
    xc = np.where(under, f32(0.0), np.minimum(x, f32(89.0)))
    fx = (xc * f32(1.44269504088896341) + f32(12582912.0)) - f32(12582912.0)
    r = xc - fx * f32(0.693359375) - fx * f32(-2.12194440e-4)
    z = r * r
    p = _muladd(f32(1.9875691500e-4), r, f32(1.3981999507e-3))
    for c in (8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = _muladd(p, r, f32(c))
    y = _muladd(p, z, r) + f32(1.0)
    n = fx.astype(np.int32)
    n1 = n >> i32(1)
    s1 = _as_float32((n1 + i32(127)) << i32(23))
    s2 = _as_float32((n - n1 + i32(127)) << i32(23))
    out = np.where(x > f32(88.72283905206835), f32(np.inf), y * s1 * s2)
    out = np.where(under, f32(0.0), out)
    return np.where(x != x, x, out)


def _tanhf(x):
    c = f32(7.90531110763549805)
    xc = np.minimum(np.maximum(x, -c), c)
    x2 = xc * xc
    p = _muladd(f32(-2.76076847742355e-16), x2, f32(2.00018790482477e-13))
    for k in (-8.60467152213735e-11, 5.12229709037114e-08, 1.48572235717979e-05,
              6.37261928875436e-04, 4.89352455891786e-03):
        p = _muladd(p, x2, f32(k))
    q = _muladd(f32(1.19825839466702e-06), x2, f32(1.18534705686654e-04))
    for k in (2.26843463243900e-03, 4.89352518554385e-03):
        q = _muladd(q, x2, f32(k))
    out = (p * xc) / q
    ax = np.abs(x)
    out = np.where(ax > f32(9.1), np.where(x > f32(0.0), f32(1.0), f32(-1.0)), out)
    out = np.where(ax < f32(0.0004), x, out)
    return np.where(x != x, x, out)


def _erff(x):
    xc = np.minimum(np.maximum(x, f32(-4.0)), f32(4.0))
    x2 = xc * xc
    p = _muladd(f32(-2.72614225801306e-10), x2, f32(2.77068142495902e-08))
    for k in (-2.10102402082508e-06, -5.69250639462346e-05, -7.34990630326855e-04,
              -2.95459980854025e-03, -1.60960333262415e-02):
        p = _muladd(p, x2, f32(k))
    q = _muladd(f32(-1.45660718464996e-05), x2, f32(-2.13374055278905e-04))
    for k in (-1.68282697438203e-03, -7.37332916720468e-03, -1.42647390514189e-02):
        q = _muladd(q, x2, f32(k))
    return np.where(x != x, x, xc * p / q)


def _logf(x):
    sub = x < f32(1.17549435e-38)
    xs = np.where(sub, x * f32(8388608.0), x)
    bits = _as_int32(xs)
    e = ((bits >> i32(23)) & i32(0xFF)) - np.where(sub, i32(149), i32(126))
    m = _as_float32((bits & i32(0x007FFFFF)) | i32(0x3F000000))
    low = m < f32(0.707106781186547524)
    e = np.where(low, e - i32(1), e).astype(np.int32)
    m = np.where(low, m + m, m) - f32(1.0)
    z = m * m
    p = _muladd(f32(7.0376836292e-2), m, f32(-1.1514610310e-1))
    for c in (1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
              2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1):
        p = _muladd(p, m, f32(c))
    fe = e.astype(np.float32)
    y = _muladd(f32(-2.12194440e-4), fe, p * m * z) - f32(0.5) * z
    out = _muladd(f32(0.693359375), fe, m + y)
    out = np.where(x == f32(0.0), f32(-np.inf), out)
    out = np.where(x < f32(0.0), f32(np.nan), out)
    return np.where(~(x < f32(np.inf)), x, out)


def _sin_poly(d, s):
    u = _muladd(f32(2.6083159809786593541503e-06), s, f32(-0.0001981069071916863322258))
    u = _muladd(u, s, f32(0.00833307858556509017944336))
    u = _muladd(u, s, f32(-0.166666597127914428710938))
    return _muladd(s, u * d, d)


def _reduce_pi(x, q):
    d = x - q * f32(3.140625)
    d = d - q * f32(0.0009670257568359375)
    d = d - q * f32(6.2771141529083251953e-07)
    return d - q * f32(1.2154201256553420762e-10)


_ROUND_F32, _INV_PI, _TINY_SIN = f32(12582912.0), f32(0.318309886183790671538), f32(2.44140625e-4)


def _sinf(x):
    t = x * _INV_PI + _ROUND_F32
    q = t - _ROUND_F32
    d = _reduce_pi(x, q)
    d = np.where((_as_int32(t) & i32(1)).astype(bool), -d, d)
    return np.where(np.abs(x) < _TINY_SIN, x, _sin_poly(d, d * d))


def _cosf(x):
    t = (x * _INV_PI - f32(0.5)) + _ROUND_F32
    m = t - _ROUND_F32
    q = f32(2.0) * m + f32(1.0)
    d = _reduce_pi(x, q * f32(0.5))
    d = np.where((_as_int32(t) & i32(1)).astype(bool), d, -d)
    return _sin_poly(d, d * d)


def _float32_or(float32_impl, other):
    def call(x):
        return float32_impl(x) if _float32(x) else other(x)
    return call


vexp = _float32_or(_expf, functools.partial(libm, "exp"))
vtanh = _float32_or(_tanhf, functools.partial(libm, "tanh"))
verf = _float32_or(_erff, functools.partial(libm, "erf"))
vlog = _float32_or(_logf, functools.partial(libm, "log"))


def _range_checked(fast, exact):
    """A float32 sin/cos as the compiled kernel computes it: the fast polynomial, unless
    an argument is outside its range (the kernel then recomputes with libm)."""
    def call(x):
        if _float32(x) and not trig_arg_wide(x).any():
            return fast(x)
        return exact(x)
    return call


vsin = _range_checked(_sinf, functools.partial(libm, "sin"))
vcos = _range_checked(_cosf, functools.partial(libm, "cos"))


def trig_arg_wide(x):
    ax = np.abs(x)
    limit = f32(TRIG_FAST_LIMIT) if _float32(x) else TRIG_FAST_LIMIT
    return ((ax >= limit) & (ax < np.inf)).astype(np.int64)


def sigmoid(a):
    """``1.0 / (1.0 + exp(-a))``: numba types the literals float64, so the division is a
    float64 one (the kernel rounds the result to the op's dtype)."""
    one = np.float64(1.0)
    return one / (one + vexp(-a))


# --------------------------------------------------------------------------- 16-bit floats


def bf16_load(h):
    bits = (np.asarray(h).astype(np.uint32) & u32(0xFFFF)) << u32(16)
    return bits.view(np.float32)


def bf16_store(x):
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = (bits + u32(0x7FFF) + ((bits >> u32(16)) & u32(1))) >> u32(16)
    out = np.where(x != x, u32(0x7FC0), rounded)
    return out.astype(np.uint16).view(np.int16)


def f16_load(h):
    """IEEE half bits as float32; NaN made quiet as the compiled helper does."""
    u = np.asarray(h).astype(np.uint32) & u32(0xFFFF)
    sign = (u & u32(0x8000)) << u32(16)
    exp = (u >> u32(10)) & u32(0x1F)
    mant = u & u32(0x3FF)
    sub = mant.astype(np.float32) * f32(5.9604644775390625e-08)
    sub = np.where(sign != 0, -sub, sub)
    quiet = np.where(mant != 0, u32(0x00400000), u32(0))
    special = (sign | u32(0x7F800000) | quiet | (mant << u32(13))).view(np.float32)
    normal = (sign | ((exp + u32(112)) << u32(23)) | (mant << u32(13))).view(np.float32)
    return np.where(exp == 0, sub, np.where(exp == 31, special, normal))


def f16_store(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.int16)


# --------------------------------------------------------------------------- reductions


def reassoc_add(a, b):
    return a + b


max_combine = maximum
min_combine = minimum


# --------------------------------------------------------------------------- loops as arrays


def axis(size, position: int, ndim: int):
    """The values of one loop variable, ``0 .. size - 1`` along axis ``position``."""
    shape = [1] * ndim
    shape[position] = int(size)
    return np.arange(int(size), dtype=np.int64).reshape(shape)


def store(out, offset, value, shape) -> None:
    """``out[offset(i)] = value(i)`` for every index ``i`` of ``shape``."""
    out[np.broadcast_to(offset, shape)] = np.broadcast_to(value, shape)


def scatter(out, offset, value, shape, accumulate: bool) -> None:
    """A scatter's stores in loop order: the last write to an element wins, or (with
    ``accumulate``) every value is added to it, one after another."""
    where_ = np.broadcast_to(offset, shape).ravel()
    values = np.broadcast_to(value, shape).ravel()
    if accumulate:
        np.add.at(out, where_, values)
    else:
        out[where_] = values


def fold(op: str, value, shape, reduced: int, acc_dtype, init):
    """``value`` over ``shape`` reduced over its last ``reduced`` axes (kept as size 1),
    accumulated in ``acc_dtype`` as the compiled loop does."""
    full = np.broadcast_to(value, shape)
    axes = tuple(range(len(shape) - reduced, len(shape)))
    if op in ("argmax", "argmin"):
        flat = full.reshape(*shape[:len(shape) - reduced], -1)
        if flat.shape[-1] == 0:
            found = np.zeros(flat.shape[:-1], dtype=np.int64)
        else:
            found = (np.argmax if op == "argmax" else np.argmin)(flat, axis=-1)
        return found.reshape(*found.shape, *(1,) * reduced)
    if op in ("any", "all"):
        return getattr(np, op)(full != 0, axis=axes, keepdims=True)
    typed = full.astype(acc_dtype, copy=False)
    if op == "sum":
        return np.sum(typed, axis=axes, dtype=acc_dtype, keepdims=True)
    if op == "prod":
        return np.prod(typed, axis=axes, dtype=acc_dtype, keepdims=True)
    reduce = np.max if op == "max" else np.min
    return reduce(typed, axis=axes, keepdims=True, initial=init)

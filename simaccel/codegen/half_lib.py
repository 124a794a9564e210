"""16-bit float storage for generated kernels: bfloat16 and float16 buffers hold raw bits
(numpy ``int16`` arrays, numba has no 16-bit float type on the CPU); kernels load them as
float32, compute in float32, and round to nearest even once, on store.

Plain integer arithmetic and bit casts, so loops over 16-bit buffers still vectorise. The
Python bodies are the reference used under ``NUMBA_DISABLE_JIT=1`` (and they match
torch's own conversions bit for bit: NaN becomes torch's quiet NaN).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

_OPTIONS = {"cache": True, "fastmath": False, "error_model": "numpy"}


@intrinsic
def _bits_as_float32(typingctx, i):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


@intrinsic
def _float32_bits(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


def _py_bits_as_float32(bits: int) -> np.float32:
    return np.array([bits & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]


def _py_float32_bits(x: float) -> int:
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


# --------------------------------------------------------------------------- bfloat16


def bf16_load(h):
    """The float32 value of bfloat16 bits ``h`` (an int16): exact."""
    return _py_bits_as_float32((int(h) & 0xFFFF) << 16)


def bf16_store(x):
    """float32 ``x`` rounded to the nearest bfloat16 (ties to even), as int16 bits."""
    bits = _py_float32_bits(x)
    if x != x:
        out = 0x7FC0
    else:
        out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    return np.int16(out - 0x10000 if out >= 0x8000 else out)


@overload(bf16_load, jit_options=_OPTIONS)
def _bf16_load_impl(h):
    def impl(h):
        return _bits_as_float32((np.uint32(h) & np.uint32(0xFFFF)) << np.uint32(16))
    return impl


@overload(bf16_store, jit_options=_OPTIONS)
def _bf16_store_impl(x):
    def impl(x):
        bits = _float32_bits(np.float32(x))
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) \
            >> np.uint32(16)
        out = np.uint32(0x7FC0) if x != x else rounded
        return np.int16(np.uint16(out))
    return impl


# --------------------------------------------------------------------------- float16


def f16_load(h):
    """The float32 value of IEEE half bits ``h`` (an int16): exact."""
    return np.float32(np.array([int(h) & 0xFFFF], dtype=np.uint16).view(np.float16)[0])


def f16_store(x):
    """float32 ``x`` rounded to the nearest float16 (ties to even), as int16 bits."""
    return np.array([np.float16(np.float32(x))]).view(np.int16)[0]


@overload(f16_load, jit_options=_OPTIONS)
def _f16_load_impl(h):
    def impl(h):
        u = np.uint32(h) & np.uint32(0xFFFF)
        sign = (u & np.uint32(0x8000)) << np.uint32(16)
        exp = (u >> np.uint32(10)) & np.uint32(0x1F)
        mant = u & np.uint32(0x3FF)
        if exp == 0:  # zero or subnormal: mant * 2**-24, exact in float32
            mag = np.float32(mant) * np.float32(5.9604644775390625e-08)
            return -mag if sign else mag
        if exp == 31:  # inf, or NaN (made quiet, as the hardware conversion does)
            quiet = np.uint32(0x00400000) if mant else np.uint32(0)
            return _bits_as_float32(sign | np.uint32(0x7F800000) | quiet
                                    | (mant << np.uint32(13)))
        return _bits_as_float32(sign | ((exp + np.uint32(112)) << np.uint32(23))
                                | (mant << np.uint32(13)))
    return impl


@overload(f16_store, jit_options=_OPTIONS)
def _f16_store_impl(x):
    def impl(x):
        # F. Giesen's float_to_half_fast3_rtne: integer rounding for normal results, a
        # float add that lets the FPU round the subnormal ones
        u = _float32_bits(np.float32(x))
        sign = u & np.uint32(0x80000000)
        u = u ^ sign
        if u >= np.uint32(0x47800000):  # overflow to inf, or inf/NaN
            out = np.uint32(0x7E00) if u > np.uint32(0x7F800000) else np.uint32(0x7C00)
        elif u < np.uint32(0x38800000):  # a subnormal half (or zero)
            f = _bits_as_float32(u) + np.float32(0.5)
            out = _float32_bits(f) - np.uint32(0x3F000000)
        else:
            odd = (u >> np.uint32(13)) & np.uint32(1)
            u = u + np.uint32(0xC8000FFF) + odd  # rebias the exponent (mod 2**32), round
            out = u >> np.uint32(13)
        return np.int16(np.uint16(out | (sign >> np.uint32(16))))
    return impl


"""``lib.opaque_extent(n)``: a loop extent LLVM cannot see, for short reduction loops.

LLVM fully unrolls a loop of a known trip count up to ~64 steps before its vectoriser
runs. A sum survives that (its reassociating adds are re-vectorised), a max or min
reduction does not: it is left one scalar compare per element. Measured with numba 0.68
on this machine, 1 thread, a max over rows of n float32s (ns per element):

| n   | static extent | opaque extent |
|-----|---------------|---------------|
| 16  | 0.40          | 0.16          |
| 32  | 0.44          | 0.11          |
| 64  | 0.44          | 0.10          |
| 128 | 0.05          | 0.07 (not used: LLVM vectorises it anyway) |

Kernels call it through :mod:`simaccel.codegen.kernel_lib` (which re-exports it).
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

from simaccel.codegen.fma_lib import LIB_OPTIONS


def opaque_extent(n):
    """n (an int). In kernels its value passes through an empty inline-asm move, which
    LLVM cannot look through, so a loop over it keeps its loop form."""
    return n


@intrinsic
def _opaque_int64(typingctx, n):
    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64)])
        return builder.asm(fnty, "", "=r,0", [args[0]], side_effect=False)
    return types.int64(types.int64), codegen


@overload(opaque_extent, jit_options=LIB_OPTIONS)
def _opaque_extent_impl(n):
    if isinstance(n, types.Integer):
        return lambda n: _opaque_int64(n)

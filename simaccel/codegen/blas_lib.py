"""``gemm``: the BLAS GEMM (:mod:`.blas_symbols`) as a numba intrinsic that kernel templates
call on data addresses. Importing this module registers the routines with LLVM under
simaccel's own names, so a kernel's cached machine code links in any process that
imported it (the address is resolved at load, never baked into the code)."""
from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from simaccel.codegen.blas_symbols import (GEMM_ROUTINES, THREADS_ROUTINE, gemm_addresses,
                                           threads_address)

for _dtype, _address in gemm_addresses().items():
    llvm.add_symbol(GEMM_ROUTINES[_dtype][1], _address)
if gemm_addresses():
    llvm.add_symbol(THREADS_ROUTINE[1], threads_address())

#: the characters BLAS reads as "as stored" and "transposed"
AS_STORED, TRANSPOSED = ord("N"), ord("T")


@intrinsic
def gemm(typingctx, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc):
    """Column-major ``C (m x n) = alpha * op(A) @ op(B)`` (C overwritten), ``op(X)`` the
    transpose where ``trans_x`` is :data:`TRANSPOSED`; ``a``, ``b``, ``c``: data addresses
    (bytes); ``alpha`` of the matrices' float type picks sgemm or dgemm."""
    if not isinstance(alpha, types.Float) or str(alpha) not in GEMM_ROUTINES:
        return None
    symbol = GEMM_ROUTINES[str(alpha)][1]
    signature = types.void(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc)

    def codegen(context, builder, sig, args):
        floats = args[5].type.as_pointer()

        def by_address(value, index, to):
            cast = context.cast(builder, value, sig.args[index], to)
            return cgutils.alloca_once_value(builder, cast)

        def pointer(index):
            address = context.cast(builder, args[index], sig.args[index], types.uintp)
            return builder.inttoptr(address, floats)
        i8, i32 = types.uint8, types.int32
        beta = cgutils.alloca_once_value(builder, ir.Constant(args[5].type, 0.0))
        call = [by_address(args[0], 0, i8), by_address(args[1], 1, i8),
                by_address(args[2], 2, i32), by_address(args[3], 3, i32),
                by_address(args[4], 4, i32), cgutils.alloca_once_value(builder, args[5]),
                pointer(6), by_address(args[7], 7, i32), pointer(8),
                by_address(args[9], 9, i32), beta, pointer(10), by_address(args[11], 11, i32)]
        fnty = ir.FunctionType(ir.VoidType(), [value.type for value in call])
        builder.call(cgutils.get_or_insert_function(builder.module, fnty, symbol), call)
        return context.get_dummy_value()
    return signature, codegen


@intrinsic
def blas_threads_local(typingctx, count):
    """Set the calling thread's BLAS thread count to ``count`` (0: the global count again)
    and return the one it had: a kernel task calls the GEMM single-threaded under any
    threading layer, and restores the count, since one of its threads is the caller's."""
    if not isinstance(count, types.Integer):
        return None
    signature = types.int32(count)

    def codegen(context, builder, sig, args):
        value = context.cast(builder, args[0], sig.args[0], types.int32)
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)])
        function = cgutils.get_or_insert_function(builder.module, fnty, THREADS_ROUTINE[1])
        return builder.call(function, [value])
    return signature, codegen

"""``lib.fma(a, b, c)``: a * b + c rounded once, for ``prims.fma`` (torch.optim's
``addcmul_`` in Dynamo's graphs). Kernels call it through :mod:`simaccel.codegen.kernel_lib`
(which re-exports it); in kernels it is LLVM's ``llvm.fma`` (one fused multiply-add
instruction on x86-64 with FMA, libm's ``fma`` elsewhere).
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

#: Options of every helper (this module's, kernel_lib's, loop_lib's). ``fastmath`` is set
#: explicitly: numba lets a callee that leaves it unset inherit its caller's flags, and a
#: helper first compiled from a fastmath caller would then be cached with reassociated
#: arithmetic for every later caller (exp's round-to-nearest trick and the Cody-Waite
#: reductions depend on exact evaluation order). Kernels themselves compile without
#: fastmath; sum reductions reassociate only their accumulation (reassoc_add).
LIB_OPTIONS = {"cache": True, "fastmath": False, "error_model": "numpy"}


def fma(a, b, c):
    """a * b + c rounded once in kernels; in plain Python (``NUMBA_DISABLE_JIT=1``) in
    float64, which rounds a second time for float64 operands."""
    return float(a) * float(b) + float(c)


@intrinsic
def _llvm_fma(typingctx, a, b, c):
    def codegen(context, builder, signature, args):
        name = f"llvm.fma.f{32 if signature.args[0] == types.float32 else 64}"
        fnty = ir.FunctionType(args[0].type, [args[0].type] * 3)
        return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)
    return a(a, b, c), codegen


@overload(fma, jit_options=LIB_OPTIONS)
def _fma_impl(a, b, c):
    fused = isinstance(a, types.Float) and a == b == c
    return (lambda a, b, c: _llvm_fma(a, b, c)) if fused else (lambda a, b, c: a * b + c)

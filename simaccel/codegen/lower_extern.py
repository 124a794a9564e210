"""Matrix multiplication: float GEMMs as library calls, other dtypes as a template.
(Convolution, pooling and scans have modules of their own: :mod:`.lower_conv`,
:mod:`.lower_pool`, :mod:`.lower_scan`.)"""
from __future__ import annotations

import operator
from typing import Any

import torch

from simaccel.codegen import library, templates
from simaccel.codegen.graph import GraphLowering, extern
from simaccel.codegen.input_views import VIEW_OPS
from simaccel.codegen.ir import LibraryKernel
from simaccel.codegen.lowering import elementwise
from simaccel.codegen.operands import as_compute, as_dtype, is_half
from simaccel.codegen.registry import register
from simaccel.codegen.values import Lazy, Realized, TensorValue, cast, permute

aten = torch.ops.aten


def _matrix_operand(ctx: GraphLowering, x: TensorValue, dtype: str) -> tuple[Realized, bool, int]:
    """(buffer, transposed, batch stride) for the last two dims of ``x`` as a matrix.
    A lazy value is realized once for every GEMM reading it (:meth:`realize_shared`),
    and a permuted one is read as its realized base at permuted strides: a weight's
    gradient ``g.T @ h`` reads the ``g`` that ``g @ w`` reads, column-major, instead of
    computing ``g`` again into a transposed copy (a strided write: ~95 us for 64x512)."""
    if x.dtype != dtype:
        x = Lazy(x.shape, dtype, lambda i, x=x: cast(x.load(i), dtype), 1)
    if isinstance(x, Lazy) and x.permuted is not None:
        base, dims = x.permuted
        x = permute(ctx.realize_shared(base), dims)
    if isinstance(x, Realized):
        rows, cols = x.shape[-2], x.shape[-1]
        s_r, s_c = x.layout.strides[-2], x.layout.strides[-1]
        batch = x.layout.strides[0] if x.ndim == 3 else 0
        batch_ok = x.ndim == 2 or x.shape[0] == 1 or batch == 0 or batch >= rows * cols
        if batch_ok and (s_c == 1 or cols == 1) and (s_r == cols or rows == 1):
            return x, False, (0 if x.ndim == 3 and x.shape[0] == 1 else batch)
        if batch_ok and (s_r == 1 or rows == 1) and (s_c == rows or cols == 1):
            return x, True, (0 if x.ndim == 3 and x.shape[0] == 1 else batch)
    x = ctx.realize_shared(x)
    return x, False, (x.shape[-2] * x.shape[-1] if x.ndim == 3 else 0)


def matmul(ctx: GraphLowering, a: TensorValue, b: TensorValue, dtype: str,
           bias: Realized | None = None) -> TensorValue:
    """``a @ b`` for 2-D or 3-D (batched) operands into a new contiguous buffer;
    ``bias`` (a row of ``n`` elements, 2-D library GEMMs only): ``bias + a @ b``, added
    by the library before its one rounding (:func:`_bias_epilogue`)."""
    if is_half(dtype) and (dtype not in library.GEMM_DTYPES or a.ndim == 3):
        # a float32 GEMM; the consumer rounds the product once (batched ones too: in
        # attention the scores' consumer, a softmax, reads them unrounded)
        return as_dtype(matmul(ctx, as_compute(a), as_compute(b), "float32"), dtype)
    batch = a.shape[0] if a.ndim == 3 else 1
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    out = ctx.new_tensor((batch, m, n) if a.ndim == 3 else (m, n), dtype)
    ra, a_t, a_bs = _matrix_operand(ctx, a, dtype)
    rb, b_t, b_bs = _matrix_operand(ctx, b, dtype)
    buffers = [out.layout.buffer, ra.layout.buffer, rb.layout.buffer]
    if bias is not None:
        buffers.append(bias.layout.buffer)
    params = [batch, m, k, n, ra.layout.offset, a_bs, rb.layout.offset, b_bs]
    itemsize = 2 if is_half(dtype) else 4
    flops, nbytes = 2 * batch * m * n * k, itemsize * (batch * (m * k + k * n + m * n))
    if dtype in library.GEMM_DTYPES:  # a BLAS call on the device buffers: no JIT compile
        fn = library.gemm_for(dtype, bias is not None)
        ctx.add_kernel(LibraryKernel(ctx.kernel_name("gemm"), fn, buffers,
                                     params + [int(a_t), int(b_t)], flops, nbytes,
                                     writes=frozenset((out.layout.buffer,))))
        return out
    extern(ctx, templates.matmul(a_t, b_t), buffers, params,
           flops=flops, bytes_moved=nbytes, writes=(out.layout.buffer,))
    return out


@register(aten.mm.default, aten.bmm.default)
def _mm(ctx: GraphLowering, a: TensorValue, b: TensorValue) -> Realized:
    return matmul(ctx, a, b, ctx.out_dtype())


@register(aten.addmm.default, aten.baddbmm.default)
def _addmm(ctx: GraphLowering, bias: Any, a: TensorValue, b: TensorValue, *,
           beta: Any = 1, alpha: Any = 1) -> TensorValue:
    dtype = ctx.out_dtype()
    if _bias_epilogue(bias, a, b, dtype, beta, alpha,
                      _in_place_readers(ctx.current)):
        row = ctx.realize_contiguous(as_dtype(bias, dtype))
        if row.layout.offset:  # the library call reads the row from element 0
            row = ctx.realize_contiguous_copy(row)
        return matmul(ctx, a, b, dtype, bias=row)
    product = matmul(ctx, a, b, dtype)
    scaled = product if alpha == 1 else elementwise(ctx, "mul", [product, alpha])
    if beta == 0:
        return elementwise(ctx, "identity", [scaled])
    scaled_bias = bias if beta == 1 else elementwise(ctx, "mul", [bias, beta])
    return elementwise(ctx, "add", [scaled_bias, scaled])


def _bias_epilogue(bias: Any, a: TensorValue, b: TensorValue, dtype: str, beta: Any,
                   alpha: Any, readers: int) -> bool:
    """Whether ``beta * bias + alpha * a @ b`` runs as one library GEMM with a bias
    epilogue: a linear layer (2-D, a row bias, beta = alpha = 1) in bfloat16, or in
    float32 or float64 where several kernels read the result as stored (``readers``:
    :func:`_in_place_readers`). In bfloat16 the library adds the bias to its float32
    accumulator and rounds once, as eager's bfloat16 addmm does; adding it afterwards
    would round the product twice. A float32 result otherwise has the bias add fused into
    the kernels that read it (no pass of its own); a kernel that reads it as stored takes
    it realized, so each would have the bias added by a copy kernel of its own (a fused
    qkv projection's k and v, which the attention kernel reads in place: measured on a
    GPT-2 layer, 2x64 tokens, the copies took ~30 us a layer)."""
    if beta != 1 or alpha != 1 or a.ndim != 2 or b.ndim != 2 \
            or not isinstance(bias, TensorValue) or bias.ndim != 1 \
            or bias.shape[0] != b.shape[-1] or dtype not in library.GEMM_DTYPES:
        return False
    return dtype == "bfloat16" or readers > 1


#: ops through which a GEMM's result reaches its consumers as stored (views, splits)
_PASSED_THROUGH = VIEW_OPS | {aten._unsafe_view.default, aten.split.Tensor,
                              aten.split_with_sizes.default, operator.getitem}
#: ops whose kernel reads its tensor operands as stored (a producer's pointwise work
#: cannot fuse into it)
_READS_AS_STORED = {aten._scaled_dot_product_flash_attention_for_cpu.default}


def _in_place_readers(node: Any) -> int:
    """How many ops of :data:`_READS_AS_STORED` read the value of the ATen ``node``
    through views and splits."""
    count, stack = 0, list(getattr(node, "users", ()))
    while stack:
        user = stack.pop()
        if user.op == "call_function" and user.target in _PASSED_THROUGH:
            stack.extend(user.users)
        else:
            count += user.op == "call_function" and user.target in _READS_AS_STORED
    return count

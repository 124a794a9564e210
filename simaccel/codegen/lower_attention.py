"""CPU flash attention's forward (``_scaled_dot_product_flash_attention_for_cpu``): the
fused attention template (:mod:`.templates_attention`) where it takes the operands, else
one library call of the op itself (:mod:`.lower_library`). :mod:`simaccel.attention`
keeps the op in the graph for exactly these cases; the others it decomposes."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from simaccel.codegen import templates_attention
from simaccel.codegen.graph import GraphLowering, extern
from simaccel.codegen.dtypes import compute_dtype
from simaccel.codegen.ir import Layout
from simaccel.codegen.lower_library import library_call
from simaccel.codegen.operands import as_dtype
from simaccel.codegen.registry import register
from simaccel.codegen.sizes import Size, is_symbolic, is_value, known_true, prod, shape_of
from simaccel.codegen.values import Realized, TensorValue

aten = torch.ops.aten


def _operand(ctx: GraphLowering, x: TensorValue) -> tuple[Realized, list[Size]]:
    """``x`` as a buffer the template reads in place where its dim stride is 1 (any batch,
    head and row strides that BLAS takes), else a contiguous copy; and its (offset,
    batch, head, row) strides in elements."""
    if isinstance(x, Realized):
        strides = list(x.layout.strides[:3])
        rows, dim = x.shape[2], x.shape[3]
        if is_value(rows, 1):  # BLAS takes a row stride of at least the row's length
            strides[2] = dim
        if (is_value(x.layout.strides[3], 1) or is_value(dim, 1)) \
                and known_true(strides[2] >= dim):
            return x, [x.layout.offset, *strides]
    x = ctx.realize_contiguous(x)
    _, h, rows, dim = x.shape
    return x, [0, h * rows * dim, rows * dim, dim]


def _mask_operand(ctx: GraphLowering, mask: TensorValue) -> tuple[Realized, list[Size]]:
    """The additive mask as a buffer the template reads in place (a broadcast view as it
    is stored), and its offset and (batch, head, query, key) strides in elements: 0 along
    the dims it is broadcast on (size 1, or missing in front)."""
    mask = ctx.realize(mask)
    strides = [0 if is_value(n, 1) else stride
               for n, stride in zip(mask.shape, mask.layout.strides)]
    return mask, [mask.layout.offset, *[0] * (4 - len(strides)), *strides]


def fused_attention(ctx: GraphLowering, query: TensorValue, key: TensorValue,
                    value: TensorValue, mask: TensorValue | None, is_causal: bool,
                    scale: float | None, metas: list[Any]) -> list[TensorValue]:
    """(output, logsumexp) by the fused template, the output laid out as eager's op lays
    it out (``metas``: the op's example results; sizes static or dynamic). 16-bit
    operands are computed in float32 (converted as they are read into the template's
    operands) and the output rounded once; the logsumexp is float32, as eager's."""
    dtype = compute_dtype(query.dtype)
    operands = [_operand(ctx, as_dtype(x, dtype)) for x in (query, key, value)]
    if mask is not None:
        operands.append(_mask_operand(ctx, as_dtype(mask, dtype)))
    shape, out_strides = shape_of(metas[0].shape), shape_of(metas[0].stride())
    out_name = ctx.new_buffer(dtype, prod(shape))
    out = Realized(shape, dtype, Layout(out_name, shape, out_strides, 0))
    lse = ctx.new_tensor(tuple(query.shape[:3]), dtype)
    factor = None if scale is None else float(scale)
    masked = mask is not None
    key_stride = operands[3][1][4] if masked else None
    source = templates_attention.attention(
        dtype, is_causal, factor, masked, None if is_symbolic(key_stride) else key_stride)
    params = _params(query, key, value, is_causal, [s for _, s in operands], out_strides)
    buffers = [out_name, lse.layout.buffer] + [x.layout.buffer for x, _ in operands]
    extern(ctx, source, buffers, params, *_cost(query, key, value, mask, is_causal, dtype),
           parallel=True, writes=(out_name, lse.layout.buffer),
           numpy_source=templates_attention.attention_numpy(dtype, is_causal, factor,
                                                            masked))
    return [as_dtype(out, query.dtype), lse]


def _params(query: TensorValue, key: TensorValue, value: TensorValue, is_causal: bool,
            strides: list[list[Size]], out_strides: tuple[Size, ...]) -> list[Size]:
    """The template's parameters (:data:`~.templates_attention.PARAMS`, then the mask's):
    sizes, the query block, the heads per key head, each operand's offset and strides."""
    b, h, length, dim = query.shape
    params = [b, h, length, key.shape[2], dim, value.shape[3],
              templates_attention.query_block(length, is_causal, b * h),
              templates_attention.heads_group(h, key.shape[1])]
    for operand in strides[:3]:
        params += operand
    return [*params, *out_strides[:3], *(strides[3] if len(strides) > 3 else [])]


def _cost(query: TensorValue, key: TensorValue, value: TensorValue,
          mask: TensorValue | None, is_causal: bool, dtype: str) -> tuple[Size, Size]:
    """(flops, bytes moved) of the kernel: two products per query and key it sees (about
    half the keys when causal), each operand read once and the output written once."""
    b, h, length, dim = query.shape
    keys, dim_v = key.shape[2], value.shape[3]
    macs = b * h * length * keys * (dim + dim_v)
    nbytes = np.dtype(dtype).itemsize * (b * h * length * (dim + dim_v + 1)
                                         + b * key.shape[1] * keys * (dim + dim_v)
                                         + (prod(mask.shape) if mask is not None else 0))
    return (macs if is_causal else 2 * macs), nbytes


@register(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _flash_forward(ctx: GraphLowering, query: TensorValue, key: TensorValue,
                   value: TensorValue, dropout_p: float = 0.0, is_causal: bool = False, *,
                   attn_mask: Any = None, scale: float | None = None) -> list[Any]:
    metas = list(ctx.meta(ctx.current))
    operands = [x for x in (query, key, value, attn_mask) if x is not None]
    if templates_attention.fused_attention_takes(
            [x.shape for x in operands], [x.dtype for x in operands], dropout_p):
        return fused_attention(ctx, query, key, value, attn_mask, is_causal, scale, metas)
    kwargs = {"attn_mask": attn_mask, "scale": scale}
    return library_call(ctx, "attention", ctx.current.target,
                        (query, key, value, dropout_p, is_causal), kwargs, metas)

"""Lowerings of views (no kernel), concatenation, padding and scatter-into-slice ops."""
from __future__ import annotations

from typing import Any

import torch

from simaccel.codegen.graph import GraphLowering
from simaccel.codegen.ir import Const, Expr, IndexValue, Op, paren
from simaccel.codegen.registry import register
from simaccel.codegen.sizes import is_value, shape_of, smax, source
from simaccel.codegen.values import (Lazy, Realized, TensorValue, cast, expand, permute, reshape_lazy, select, slice_dim, squeeze,
                                     unsqueeze, view_strides)

aten = torch.ops.aten


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(ctx: GraphLowering, x: TensorValue, shape: list[int]) -> TensorValue:
    shape = ctx.out_shape()  # the traced shape: -1 resolved, sizes symbolic where dynamic
    if isinstance(x, Realized):
        strides = view_strides(x.shape, x.layout.strides, shape)
        if strides is not None:
            return x.restrided(shape, strides, x.layout.offset)
        x = ctx.realize_contiguous(x)
        return x.restrided(shape, view_strides(x.shape, x.layout.strides, shape),
                           x.layout.offset)
    return reshape_lazy(x, shape)


@register(aten.permute.default)
def _permute(ctx: GraphLowering, x: TensorValue, dims: list[int]) -> TensorValue:
    return permute(x, list(dims))


@register(aten.transpose.int)
def _transpose(ctx: GraphLowering, x: TensorValue, d0: int, d1: int) -> TensorValue:
    dims = list(range(x.ndim))
    if x.ndim:
        dims[d0 % x.ndim], dims[d1 % x.ndim] = dims[d1 % x.ndim], dims[d0 % x.ndim]
    return permute(x, dims)


@register(aten.t.default, aten.numpy_T.default)
def _t(ctx: GraphLowering, x: TensorValue) -> TensorValue:
    return permute(x, list(reversed(range(x.ndim))))


@register(aten.expand.default)
def _expand(ctx: GraphLowering, x: TensorValue, shape: list[int], implicit: bool = False):
    return expand(x, list(shape))


@register(aten.unsqueeze.default)
def _unsqueeze(ctx: GraphLowering, x: TensorValue, dim: int) -> TensorValue:
    return unsqueeze(x, dim)


@register(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(ctx: GraphLowering, x: TensorValue, dim: Any = None) -> TensorValue:
    dims = None if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    return squeeze(x, dims)


@register(aten.slice.Tensor)
def _slice(ctx: GraphLowering, x: TensorValue, dim: int = 0, start: Any = None,
           end: Any = None, step: int = 1) -> TensorValue:
    return slice_dim(x, dim, start, end, step)


@register(aten.select.int)
def _select(ctx: GraphLowering, x: TensorValue, dim: int, index: int) -> TensorValue:
    return select(x, dim, index)


@register(aten.as_strided.default)
def _as_strided(ctx: GraphLowering, x: TensorValue, size: list[int], stride: list[int],
                storage_offset: int | None = None) -> TensorValue:
    base = ctx.realize_contiguous(x) if not isinstance(x, Realized) else x
    offset = base.layout.offset if storage_offset is None else storage_offset
    return base.restrided(tuple(size), tuple(stride), offset)


@register(aten.split.Tensor, aten.split_with_sizes.default)
def _split(ctx: GraphLowering, x: TensorValue, sizes: Any, dim: int = 0) -> list[TensorValue]:
    dim = dim % x.ndim
    # the pieces' traced sizes (an int split size over a dynamic dim: as Dynamo traced it)
    sizes = [shape_of(m.shape)[dim] for m in ctx.meta(ctx.current)]
    pieces, start = [], 0
    for size in sizes:
        pieces.append(slice_dim(x, dim, start, start + size, 1))
        start += size
    return pieces


@register(aten.unbind.int)
def _unbind(ctx: GraphLowering, x: TensorValue, dim: int = 0) -> list[TensorValue]:
    return [select(x, dim, k) for k in range(x.shape[dim % x.ndim])]


@register(aten.cat.default)
def _cat(ctx: GraphLowering, tensors: list[TensorValue], dim: int = 0) -> Realized:
    out = ctx.new_tensor(ctx.out_shape(), ctx.out_dtype())
    dim = dim % len(out.shape)
    start = 0
    for t in tensors:
        if t.ndim == 1 and is_value(t.shape[0], 0) and len(out.shape) != 1:
            continue  # legacy empty tensors take no part in cat
        size = t.shape[dim]
        target = slice_dim(out, dim, start, start + size, 1)
        ctx.realize_into(_as_dtype(t, out.dtype), target)
        start += size
    return out


@register(aten.stack.default)
def _stack(ctx: GraphLowering, tensors: list[TensorValue], dim: int = 0) -> Realized:
    out = ctx.new_tensor(ctx.out_shape(), ctx.out_dtype())
    dim = dim % len(out.shape)
    for k, t in enumerate(tensors):
        ctx.realize_into(_as_dtype(t, out.dtype), select(out, dim, k))
    return out


def _as_dtype(t: TensorValue, dtype: str) -> TensorValue:
    if t.dtype == dtype:
        return t
    return Lazy(t.shape, dtype, lambda index: cast(t.load(index), dtype), 1)


@register(aten.constant_pad_nd.default)
def _pad(ctx: GraphLowering, x: TensorValue, pad: list[int], value: Any = 0) -> Lazy:
    shape, dtype = ctx.out_shape(), ctx.out_dtype()
    n = len(pad) // 2
    dims = [x.ndim - 1 - k for k in range(n)]  # pad pairs start at the last dim

    def fn(index: list[str]) -> Expr:
        src, conds = list(index), []
        for k, d in enumerate(dims):
            before = pad[2 * k]
            src[d] = f"{index[d]} - {source(before)}" if not is_value(before, 0) else index[d]
            conds.append(f"0 <= {paren(src[d])} < {source(x.shape[d])}")
        inside = IndexValue(" and ".join(conds) or "True", "bool")
        safe = [f"min(max({s}, 0), {source(smax(x.shape[d] - 1, 0))})" if d in dims else s
                for d, s in enumerate(src)]
        return Op("where", (inside, cast(x.load(safe), dtype), Const(value, dtype)), dtype)
    return Lazy(shape, dtype, fn, getattr(x, "ops", 0) + 1)


@register(aten.slice_scatter.default)
def _slice_scatter(ctx: GraphLowering, base: TensorValue, src: TensorValue, dim: int = 0,
                   start: Any = None, end: Any = None, step: int = 1) -> Realized:
    out = ctx.realize_contiguous_copy(base)
    ctx.realize_into(_as_dtype(src, out.dtype), slice_dim(out, dim, start, end, step))
    return out


@register(aten.select_scatter.default)
def _select_scatter(ctx: GraphLowering, base: TensorValue, src: TensorValue, dim: int,
                    index: int) -> Realized:
    out = ctx.realize_contiguous_copy(base)
    ctx.realize_into(_as_dtype(src, out.dtype), select(out, dim, index))
    return out


@register(aten.diagonal.default)
def _diagonal(ctx: GraphLowering, x: TensorValue, offset: int = 0, dim1: int = 0,
              dim2: int = 1) -> TensorValue:
    base = x if isinstance(x, Realized) else ctx.realize(x)
    d1, d2 = dim1 % x.ndim, dim2 % x.ndim
    shape = ctx.out_shape()
    st = base.layout.strides
    start = base.layout.offset + (offset * st[d2] if offset >= 0 else -offset * st[d1])
    keep = [k for k in range(x.ndim) if k not in (d1, d2)]
    strides = [st[k] for k in keep] + [st[d1] + st[d2]]
    return base.restrided(shape, strides, start)


@register(torch.ops.prims.broadcast_in_dim.default)
def _broadcast_in_dim(ctx: GraphLowering, x: TensorValue, shape: list[int],
                      broadcast_dimensions: list[int]) -> TensorValue:
    value = x
    for d in range(len(shape)):
        if d not in broadcast_dimensions:
            value = unsqueeze(value, d)
    return expand(value, list(shape))


@register(torch.ops.prims.squeeze.default)
def _prims_squeeze(ctx: GraphLowering, x: TensorValue, dims: list[int]) -> TensorValue:
    return squeeze(x, list(dims))

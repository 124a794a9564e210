"""Lowerings of data movement that is not a plain view: flips, repeats, sliding windows,
the ``*_copy`` variants of views, scatters into views, and uninitialised constructors
with a layout. All are index remaps: lazy values that fuse into their users (a flip
followed by an add is one kernel), or views of a realized buffer where strides can say it.
"""
from __future__ import annotations

from typing import Any

import torch

from simaccel.codegen.graph import GraphLowering
from simaccel.codegen.ir import Const, Expr, IndexValue, PointwiseKernel, affine, paren
from simaccel.codegen.lowering import lazy_const
from simaccel.codegen.operands import as_dtype
from simaccel.codegen.registry import LOWERINGS, register
from simaccel.codegen.sizes import is_value, smax, smin, source
from simaccel.codegen.values import Lazy, Realized, TensorValue, cast, slice_dim

aten = torch.ops.aten


def _ops(x: Any) -> int:
    return getattr(x, "ops", 0) + 1


@register(aten.flip.default)
def _flip(ctx: GraphLowering, x: TensorValue, dims: list[int]) -> TensorValue:
    flipped = {d % x.ndim for d in dims} if x.ndim else set()

    def fn(index: list[str]) -> Expr:
        return x.load([f"{source(x.shape[d] - 1)} - {paren(i)}" if d in flipped else i
                       for d, i in enumerate(index)])
    return Lazy(x.shape, x.dtype, fn, _ops(x))


@register(aten.repeat.default)
def _repeat(ctx: GraphLowering, x: TensorValue, repeats: list[int]) -> TensorValue:
    """``x`` tiled ``repeats`` times per dim (leading repeats add dims): index mod size."""
    lead = len(repeats) - x.ndim
    shape = ctx.out_shape()

    def fn(index: list[str]) -> Expr:
        src = []
        for d in range(x.ndim):
            i, n = index[lead + d], x.shape[d]
            src.append("0" if is_value(n, 1) else
                       i if is_value(repeats[lead + d], 1) else f"{paren(i)} % {source(n)}")
        return x.load(src)
    return Lazy(shape, x.dtype, fn, _ops(x))


@register(aten.unfold.default)
def _unfold(ctx: GraphLowering, x: TensorValue, dim: int, size: int, step: int) -> TensorValue:
    """Sliding windows of ``size`` every ``step`` along ``dim``, as a new last dim: a view
    of a realized tensor, an index remap of a lazy one."""
    shape = ctx.out_shape()
    if x.ndim == 0:  # a 0-d tensor unfolds to one window of one element
        return Lazy(shape, x.dtype, lambda index: x.load([]), _ops(x))
    dim = dim % x.ndim
    if isinstance(x, Realized):
        strides = list(x.layout.strides)
        window = strides[dim]
        strides[dim] = window * step
        return x.restrided(shape, strides + [window], x.layout.offset)

    def fn(index: list[str]) -> Expr:
        src = list(index[:-1])
        src[dim] = affine([(index[dim], step), (index[-1], 1)])
        return x.load(src)
    return Lazy(shape, x.dtype, fn, _ops(x))


@register(aten.narrow_copy.default)
def _narrow_copy(ctx: GraphLowering, x: TensorValue, dim: int, start: Any,
                 length: Any) -> TensorValue:
    return slice_dim(x, dim, start, start + length, 1)


#: ``*_copy`` op -> the view op whose lowering it shares: functional graphs never write
#: through a view, so the copy and the view compute the same values (an output that is
#: a view is copied to the host like any other).
_VIEW_OF_COPY = {
    aten.view_copy.default: aten.view.default,
    aten._reshape_copy.default: aten.view.default,
    aten.permute_copy.default: aten.permute.default,
    aten.t_copy.default: aten.t.default,
    aten.transpose_copy.int: aten.transpose.int,
    aten.unsqueeze_copy.default: aten.unsqueeze.default,
    aten.squeeze_copy.default: aten.squeeze.default,
    aten.squeeze_copy.dim: aten.squeeze.dim,
    aten.squeeze_copy.dims: aten.squeeze.dims,
    aten.expand_copy.default: aten.expand.default,
    aten.diagonal_copy.default: aten.diagonal.default,
    aten.as_strided_copy.default: aten.as_strided.default,
    aten.unbind_copy.int: aten.unbind.int,
    aten.split_with_sizes_copy.default: aten.split_with_sizes.default,
    aten.unfold_copy.default: aten.unfold.default,
    aten.alias_copy.default: aten.alias.default,
}
for _copy_op, _view_op in _VIEW_OF_COPY.items():
    if _view_op in LOWERINGS:
        register(_copy_op)(LOWERINGS[_view_op])


def diagonal_view(out: Realized, offset: int, dim1: int, dim2: int) -> Realized:
    """The ``diagonal(offset, dim1, dim2)`` view of a realized tensor (strides only)."""
    d1, d2 = dim1 % out.ndim, dim2 % out.ndim
    n1, n2 = out.shape[d1], out.shape[d2]
    length = smin(n1, n2 - offset) if offset >= 0 else smin(n1 + offset, n2)
    st = out.layout.strides
    start = out.layout.offset + (offset * st[d2] if offset >= 0 else -offset * st[d1])
    keep = [k for k in range(out.ndim) if k not in (d1, d2)]
    shape = tuple(out.shape[k] for k in keep) + (smax(length, 0),)
    return out.restrided(shape, [st[k] for k in keep] + [st[d1] + st[d2]], start)


@register(aten.diagonal_scatter.default)
def _diagonal_scatter(ctx: GraphLowering, base: TensorValue, src: TensorValue, offset: int = 0,
                      dim1: int = 0, dim2: int = 1) -> Realized:
    out = ctx.realize_contiguous_copy(base)
    ctx.realize_into(as_dtype(src, out.dtype), diagonal_view(out, offset, dim1, dim2))
    return out


@register(aten.as_strided_scatter.default)
def _as_strided_scatter(ctx: GraphLowering, base: TensorValue, src: TensorValue,
                        size: list[int], stride: list[int],
                        storage_offset: Any = None) -> Realized:
    """A copy of ``base`` (contiguous, as ATen's clone of a contiguous tensor) with ``src``
    written through the strided window."""
    out = ctx.realize_contiguous_copy(base)
    window = out.restrided(tuple(size), tuple(stride), storage_offset or 0)
    ctx.realize_into(as_dtype(src, out.dtype), window)
    return out


@register(aten.empty_permuted.default, aten.new_empty_strided.default)
def _empty_with_layout(ctx: GraphLowering, *args: Any, **kwargs: Any) -> Lazy:
    """Uninitialised memory: any contents are valid; zeros are deterministic. The host
    output still gets the layout eager gives it (the program copies into it)."""
    return lazy_const(ctx, 0)


@register(aten.fill.Scalar, aten.fill.Tensor)
def _fill(ctx: GraphLowering, x: TensorValue, value: Any) -> Lazy:
    if isinstance(value, TensorValue):
        dtype = ctx.out_dtype()
        return Lazy(x.shape, dtype, lambda index: as_dtype(value, dtype).load([]), 1)
    return lazy_const(ctx, value)



@register(aten._efficientzerotensor.default)
def _zero_tensor(ctx: GraphLowering, *args: Any, **kwargs: Any) -> Lazy:
    return lazy_const(ctx, 0)


@register(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
          aten.replication_pad3d_backward.default)
def _replication_pad_backward(ctx: GraphLowering, grad: TensorValue, x: TensorValue,
                              padding: list[int]) -> Realized:
    """Each output gradient adds into the input element its position was copied from
    (the nearest edge one for a padded position): a serial scatter-add."""
    out = ctx.realize_contiguous_copy(Lazy(x.shape, grad.dtype, lambda i: Const(
        0, grad.dtype), 0))
    index = [f"i{k}" for k in range(grad.ndim)]
    terms, exprs = [], []
    padded = {x.ndim - 1 - k: padding[2 * k] for k in range(len(padding) // 2)}
    for d, (i, stride) in enumerate(zip(index, out.layout.strides)):
        if d not in padded:
            terms.append((i, stride))
            continue
        pos = IndexValue(f"min(max({i} - {source(padded[d])}, 0), {source(x.shape[d] - 1)})",
                         "int64")
        terms.append((f"{{{len(exprs)}}}", stride))
        exprs.append(pos)
    ctx.add_kernel(PointwiseKernel(ctx.kernel_name("scatter"), out.layout,
                                   cast(grad.load(index), out.dtype), index,
                                   affine(terms, out.layout.offset), tuple(exprs), True,
                                   grad.shape))
    return out

"""Indexing lowerings: gathers are indirect loads (they fuse like pointwise ops),
scatters are serial kernels with an indirect store."""
from __future__ import annotations

from typing import Any

import torch

from simaccel.codegen.graph import GraphLowering, Unsupported
from simaccel.codegen.ir import Const, Expr, Load, Op, PointwiseKernel, affine, size_value
from simaccel.codegen.registry import register
from simaccel.codegen.values import Lazy, Realized, TensorValue, broadcast_index, cast

aten = torch.ops.aten


def wrap_index(expr: Expr, size: Any, negative_ok: bool = True) -> Expr:
    """A Python-style negative index wrapped into ``[0, size)`` and checked to be there:
    an index outside ``[-size, size)`` (``[0, size)`` without ``negative_ok``, as
    ``embedding`` wants) raises when the kernel runs, as in eager, instead of reading or
    writing outside the buffer."""
    expr = cast(expr, "int64")
    if negative_ok:
        negative = Op("lt", (expr, Const(0, "int64")), "bool")
        expr = Op("where", (negative, Op("add", (expr, size_value(size)), "int64"), expr),
                  "int64")
    return Op("checked_index", (expr, size_value(size)), "int64")


def indirect_load(x: Realized, index: list[str], indirect: dict[int, Expr],
                  negative_ok: bool = True) -> Load:
    """Load ``x`` at ``index``, where dims in ``indirect`` take a computed (Expr) index
    (negative ones count from the end, unless ``negative_ok`` is False)."""
    terms, exprs = [], []
    for d, (i, stride) in enumerate(zip(index, x.layout.strides)):
        if d in indirect:
            terms.append((f"{{{len(exprs)}}}", stride))
            exprs.append(wrap_index(indirect[d], x.shape[d], negative_ok))
        else:
            terms.append((i, stride))
    return Load(x.layout.buffer, affine(terms, x.layout.offset), x.dtype, tuple(exprs))


def _base(ctx: GraphLowering, x: TensorValue) -> Realized:
    return x if isinstance(x, Realized) else ctx.realize(x)


@register(aten.gather.default)
def _gather(ctx: GraphLowering, x: TensorValue, dim: int, index: TensorValue,
            sparse_grad: bool = False) -> Lazy:
    base, dim = _base(ctx, x), dim % max(x.ndim, 1)

    def fn(idx: list[str]) -> Expr:
        # eager's gather takes no negative index
        return indirect_load(base, idx, {dim: index.load(idx)}, negative_ok=False)
    return Lazy(index.shape, x.dtype, fn, 2)


@register(aten.index_select.default)
def _index_select(ctx: GraphLowering, x: TensorValue, dim: int, index: TensorValue) -> Lazy:
    if x.ndim == 0:  # a 0-d tensor's one valid index (0 or -1) selects the tensor itself
        return Lazy((), x.dtype, lambda idx: x.load([]), 1)
    base, dim = _base(ctx, x), dim % max(x.ndim, 1)
    flat_index = index if index.ndim else None

    def fn(idx: list[str]) -> Expr:
        k = flat_index.load([idx[dim]]) if flat_index is not None else index.load([])
        return indirect_load(base, idx, {dim: k}, negative_ok=False)  # as eager's
    return Lazy(ctx.out_shape(), x.dtype, fn, 2)


@register(aten.embedding.default)
def _embedding(ctx: GraphLowering, weight: TensorValue, indices: TensorValue,
               padding_idx: int = -1, scale_grad: bool = False, sparse: bool = False) -> Lazy:
    base = _base(ctx, weight)
    n = indices.ndim

    def fn(idx: list[str]) -> Expr:
        row = indices.load(idx[:n])  # eager's embedding takes no negative ids
        return indirect_load(base, ["0", idx[n]], {0: row}, negative_ok=False)
    return Lazy(ctx.out_shape(), weight.dtype, fn, 2)


def _index_layout(x: TensorValue, indices: list[Any]) -> tuple[list[int], tuple[int, ...], bool]:
    """Positions of the index tensors, their broadcast shape, and whether they are adjacent."""
    positions = [d for d, t in enumerate(indices) if t is not None]
    for d in positions:
        if indices[d].dtype == "bool":
            raise Unsupported("boolean mask indexing has a data-dependent shape")
    shapes = [indices[d].shape for d in positions]
    bshape = tuple(torch.broadcast_shapes(*shapes)) if shapes else ()
    adjacent = positions == list(range(positions[0], positions[-1] + 1)) if positions else True
    return positions, bshape, adjacent


@register(aten.index.Tensor)
def _index(ctx: GraphLowering, x: TensorValue, indices: list[Any]) -> Lazy:
    base = _base(ctx, x)
    indices = list(indices) + [None] * (x.ndim - len(indices))
    positions, bshape, adjacent = _index_layout(x, indices)
    first = positions[0] if adjacent else 0
    rest = [d for d in range(x.ndim) if d not in positions]
    nb = len(bshape)

    def fn(idx: list[str]) -> Expr:
        bidx = idx[first:first + nb]
        others = idx[:first] + idx[first + nb:]
        full = ["0"] * x.ndim
        for d, i in zip(rest, others):
            full[d] = i
        indirect = {d: indices[d].load(broadcast_index(indices[d].shape, bshape, bidx))
                    for d in positions}
        return indirect_load(base, full, indirect)
    return Lazy(ctx.out_shape(), x.dtype, fn, 2)


@register(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put(ctx: GraphLowering, x: TensorValue, indices: list[Any], values: TensorValue,
               accumulate: bool = False) -> Realized:
    out = ctx.realize_contiguous_copy(x)
    indices = list(indices)
    positions, bshape, adjacent = _index_layout(x, indices + [None] * (x.ndim - len(indices)))
    if positions != list(range(len(positions))):
        raise Unsupported("index_put with index tensors after a full slice")
    tail = x.shape[len(positions):]
    shape = bshape + tail
    index = [f"i{k}" for k in range(len(shape))]
    bidx, tidx = index[:len(bshape)], index[len(bshape):]
    terms = [(f"{{{k}}}", out.layout.strides[d]) for k, d in enumerate(positions)]
    terms += list(zip(tidx, out.layout.strides[len(positions):]))
    exprs = tuple(wrap_index(indices[d].load(broadcast_index(indices[d].shape, bshape, bidx)),
                             x.shape[d]) for d in positions)
    body = _values_expr(values, shape, index, out.dtype)
    ctx.add_kernel(PointwiseKernel(ctx.kernel_name("scatter"), out.layout, body, index,
                                   affine(terms, out.layout.offset), exprs, accumulate, shape))
    return out


def _values_expr(values: Any, shape: tuple[int, ...], index: list[str], dtype: str) -> Expr:
    if isinstance(values, TensorValue):
        return cast(values.load(broadcast_index(values.shape, shape, index)), dtype)
    return Const(values, dtype)


@register(aten.scatter.src, aten.scatter.value, aten.scatter_add.default)
def _scatter(ctx: GraphLowering, x: TensorValue, dim: int, index: TensorValue,
             src: Any) -> Realized:
    out = ctx.realize_contiguous_copy(x)
    dim = dim % max(x.ndim, 1)
    shape = index.shape
    idx = [f"i{k}" for k in range(len(shape))]
    terms = [("{0}" if d == dim else i, st) for d, (i, st) in enumerate(zip(idx, out.layout.strides))]
    target = wrap_index(index.load(idx), x.shape[dim] if x.ndim else 1,
                        negative_ok=False)  # eager's scatter takes no negative index
    body = _values_expr(src, shape, idx, out.dtype) if not isinstance(src, TensorValue) \
        else cast(src.load(idx), out.dtype)
    accumulate = ctx.current.target is aten.scatter_add.default
    ctx.add_kernel(PointwiseKernel(ctx.kernel_name("scatter"), out.layout, body, idx,
                                   affine(terms, out.layout.offset), (target,), accumulate,
                                   shape))
    return out

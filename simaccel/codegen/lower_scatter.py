"""Scatter-reduce lowerings: ``scatter_reduce``, ``scatter(reduce=...)``, ``index_reduce``,
``put`` and ``masked_scatter``.

A reducing scatter is a serial kernel over the index tensor that loads its target, combines
it with the source value and stores it back (``out[t] = combine(out[t], src)``), so any
reduction fits the one scatter kernel form (:class:`~simaccel.codegen.ir.PointwiseKernel`
with a store index). ``include_self=False`` first stores the reduction's identity at every
target; ``mean`` also scatter-adds a count and divides by it.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from simaccel.codegen import templates_scatter
from simaccel.codegen.dtypes import is_float
from simaccel.codegen.graph import GraphLowering, Unsupported, extern
from simaccel.codegen.ir import Const, Expr, Load, Op, PointwiseKernel, affine
from simaccel.codegen.lower_index import wrap_index
from simaccel.codegen.operands import as_compute, as_dtype, dense
from simaccel.codegen.registry import register
from simaccel.codegen.sizes import is_value
from simaccel.codegen.values import (Lazy, Realized, TensorValue, broadcast_index, cast, expand,
                                     reshape_lazy)

aten = torch.ops.aten

_COMBINE = {"sum": "add", "mean": "add", "prod": "mul", "amax": "maximum",
            "amin": "minimum"}
_ALIASES = {"add": "sum", "multiply": "prod"}


def _identity(reduce: str, dtype: str) -> Const:
    """The value a target starts from when ``include_self`` is False."""
    if reduce == "prod":
        return Const(1, dtype)
    if reduce in ("amax", "amin"):
        low = reduce == "amax"
        if is_float(dtype):
            return Const(-math.inf if low else math.inf, dtype)
        info = torch.iinfo(getattr(torch, dtype)) if dtype != "bool" else None
        return Const((info.min if low else info.max) if info else (not low), dtype)
    return Const(0, dtype)


def _size(x: TensorValue, dim: int) -> Any:
    """The size of ``dim`` (a 0-d tensor scatters along its one element)."""
    return x.shape[dim] if x.ndim else 1


class _Target:
    """Where a scatter kernel over ``shape`` (loop variables ``index``) stores: the offset
    source in ``out`` with ``{0}`` the computed position along the scattered dim."""

    def __init__(self, out: Realized, shape: tuple, dim: int, position: Expr):
        self.out, self.shape = out, shape
        self.index = [f"i{k}" for k in range(len(shape))]
        terms = [("{0}" if d == dim else i, st)
                 for d, (i, st) in enumerate(zip(self.index, out.layout.strides))]
        self.offset = affine(terms, out.layout.offset)
        self.exprs = (position,)

    def current(self) -> Load:
        return Load(self.out.layout.buffer, self.offset, self.out.dtype, self.exprs)

    def store(self, ctx: GraphLowering, body: Expr, accumulate: bool = False) -> None:
        ctx.add_kernel(PointwiseKernel(ctx.kernel_name("scatter"), self.out.layout, body,
                                       self.index, self.offset, self.exprs, accumulate,
                                       self.shape))


def _reduce_into(ctx: GraphLowering, x: TensorValue, target_of: Any, shape: tuple,
                 value_of: Any, reduce: str, include_self: bool) -> TensorValue:
    """``x`` with ``value_of(index)`` reduced into the targets ``target_of(out)``."""
    reduce = _ALIASES.get(reduce, reduce)
    if reduce not in _COMBINE:
        raise Unsupported(f"scatter reduction {reduce!r}")
    out = ctx.realize_contiguous_copy(x)
    target: _Target = target_of(out)
    if not include_self:
        target.store(ctx, _identity(reduce, out.dtype))
    value = cast(value_of(target.index), out.dtype)
    target.store(ctx, Op(_COMBINE[reduce], (target.current(), value), out.dtype))
    if reduce != "mean":
        return out
    count_dtype = "float64" if is_float(out.dtype) else "int64"
    count = ctx.realize_contiguous_copy(Lazy(x.shape, count_dtype, lambda i: Const(
        1 if include_self else 0, count_dtype), 0))
    counter = target_of(count)
    counter.store(ctx, Const(1, count_dtype), accumulate=True)
    return _divide(out, count, count_dtype)


def _divide(out: Realized, count: Realized, count_dtype: str) -> Lazy:
    """``out / count`` where something was counted (floor division for integers)."""
    op = "truediv" if is_float(out.dtype) else "floordiv"

    def fn(index: list[str]) -> Expr:
        n, v = count.load(index), out.load(index)
        zero = Op("eq", (n, Const(0, count_dtype)), "bool")
        quotient = cast(Op(op, (cast(v, count_dtype), n), count_dtype), out.dtype)
        return Op("where", (zero, v, quotient), out.dtype)
    return Lazy(out.shape, out.dtype, fn, 3)


@register(aten.scatter_reduce.two)
def _scatter_reduce(ctx: GraphLowering, x: TensorValue, dim: int, index: TensorValue,
                    src: TensorValue, reduce: str, *, include_self: bool = True) -> TensorValue:
    dim = dim % max(x.ndim, 1)

    def target_of(out: Realized) -> _Target:
        idx = [f"i{k}" for k in range(index.ndim)]
        return _Target(out, index.shape, dim,  # eager takes no negative index here
                       wrap_index(index.load(idx), _size(x, dim), negative_ok=False))
    return _reduce_into(ctx, x, target_of, index.shape, src.load, reduce, include_self)


@register(aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter_with_reduce(ctx: GraphLowering, x: TensorValue, dim: int, index: TensorValue,
                         src: Any, *, reduce: str) -> TensorValue:
    dtype = x.dtype
    value = src if isinstance(src, TensorValue) else \
        Lazy(index.shape, dtype, lambda i: Const(src, dtype), 0)
    return _scatter_reduce(ctx, x, dim, index, value, reduce, include_self=True)


@register(aten.index_reduce.default)
def _index_reduce(ctx: GraphLowering, x: TensorValue, dim: int, index: TensorValue,
                  source: TensorValue, reduce: str, *, include_self: bool = True) -> TensorValue:
    dim = dim % max(x.ndim, 1)

    def target_of(out: Realized) -> _Target:
        position = index.load([f"i{dim}" if source.ndim else "0"]) if index.ndim \
            else index.load([])
        return _Target(out, source.shape, dim,  # eager takes no negative index here
                       wrap_index(position, _size(x, dim), negative_ok=False))
    return _reduce_into(ctx, x, target_of, source.shape, source.load, reduce, include_self)


@register(aten.put.default)
def _put(ctx: GraphLowering, x: TensorValue, index: TensorValue, source: TensorValue,
         accumulate: bool = False) -> Realized:
    """``x.flatten()[index] = source`` (``+=`` when accumulating), index and source read
    in the same (row-major) order."""
    out = ctx.realize_contiguous_copy(x)
    flat = out.restrided((out.numel,), (1,), 0)
    values = reshape_lazy(source, index.shape) if source.shape != index.shape else source
    idx = [f"i{k}" for k in range(index.ndim)]
    target = _Target(flat, index.shape, 0, wrap_index(index.load(idx), out.numel))
    target.store(ctx, cast(values.load(idx), out.dtype), accumulate=accumulate)
    return out


@register(aten.masked_scatter.default)
def _masked_scatter(ctx: GraphLowering, x: TensorValue, mask: TensorValue,
                    source: TensorValue) -> TensorValue:
    """Where ``mask`` (broadcast to ``x``) is set, the next element of ``source`` in
    row-major order: one serial pass with a running count."""
    shape = ctx.out_shape()
    out = ctx.realize_contiguous_copy(expand(as_compute(x), list(shape)))
    m = dense(ctx, expand(mask, list(shape)), "bool")
    src = dense(ctx, source, out.dtype)
    extern(ctx, templates_scatter.masked_scatter(), [out.layout.buffer, m.layout.buffer,
                                                     src.layout.buffer],
           [out.numel], out.numel, 3 * out.numel, writes=(out.layout.buffer,))
    return as_dtype(out, x.dtype)



@register(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put(ctx: GraphLowering, x: TensorValue, indices: list[Any], values: TensorValue,
               accumulate: bool = False) -> TensorValue:
    """``x[indices] = values`` (``+=``): index tensors at any dims (``None``: a full
    slice), adjacent or apart, as ``x[indices]`` lays them out; a boolean mask index with
    one value is a select."""
    indices = list(indices) + [None] * (x.ndim - len(indices))
    masks = [t for t in indices if t is not None and t.dtype == "bool"]
    if masks:
        return _masked_put(ctx, x, indices, values, accumulate)
    positions = [d for d, t in enumerate(indices) if t is not None]
    bshape = tuple(torch.broadcast_shapes(*[indices[d].shape for d in positions]))
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    first = positions[0] if adjacent else 0
    rest = [d for d in range(x.ndim) if d not in positions]
    shape = tuple(x.shape[d] for d in rest[:first]) + bshape + \
        tuple(x.shape[d] for d in rest[first:])
    out = ctx.realize_contiguous_copy(x)
    index = [f"i{k}" for k in range(len(shape))]
    bidx = index[first:first + len(bshape)]
    others = index[:first] + index[first + len(bshape):]
    terms = [(f"{{{k}}}", out.layout.strides[d]) for k, d in enumerate(positions)]
    terms += [(i, out.layout.strides[d]) for d, i in zip(rest, others)]
    exprs = tuple(wrap_index(indices[d].load(broadcast_index(indices[d].shape, bshape, bidx)),
                             x.shape[d]) for d in positions)
    body = cast(values.load(broadcast_index(values.shape, shape, index)), out.dtype) \
        if isinstance(values, TensorValue) else Const(values, out.dtype)
    ctx.add_kernel(PointwiseKernel(ctx.kernel_name("scatter"), out.layout, body, index,
                                   affine(terms, out.layout.offset), exprs, bool(accumulate),
                                   shape))
    return out


def _masked_put(ctx: GraphLowering, x: TensorValue, indices: list[Any], values: TensorValue,
                accumulate: bool) -> Lazy:
    """``x[mask] = v`` with one value ``v``: ``where(mask, v, x)`` (``x + v`` under the
    mask when accumulating); with one value per set flag, :func:`_masked_put_values`."""
    if len([t for t in indices if t is not None]) != 1:
        raise Unsupported("boolean mask indexing beside other index tensors")
    mask = next(t for t in indices if t is not None)
    lead = indices.index(mask)
    if not is_value(values.numel, 1):
        return _masked_put_values(ctx, x, mask, lead, values, accumulate)
    dtype = x.dtype

    def fn(index: list[str]) -> Expr:
        m = mask.load(index[lead:lead + mask.ndim])
        v = cast(values.load(["0"] * values.ndim), dtype)
        old = x.load(index)
        new = Op("add", (old, v), dtype) if accumulate else v
        return Op("where", (m, new, old), dtype)
    return Lazy(x.shape, dtype, fn, 3)


def _masked_put_values(ctx: GraphLowering, x: TensorValue, mask: TensorValue, lead: int,
                       values: TensorValue, accumulate: bool) -> Realized:
    """``x[mask] = values`` with a row of ``values`` per set flag of a leading ``mask``
    (the gradient of ``x[mask]``): one ordered pass over the mask. Its row count is the
    mask's data-dependent count, which the graph takes as a size."""
    if lead != 0:
        raise Unsupported("a boolean mask after a full slice in index_put")
    tail = tuple(x.shape[mask.ndim:])
    out = ctx.realize_contiguous_copy(x)
    # one row per set flag, or a single row (a broadcast value) for all of them
    rows = values.shape[0] if values.ndim == len(tail) + 1 else 1
    v = dense(ctx, as_dtype(expand(values, [rows, *tail]), out.dtype), out.dtype)
    m = dense(ctx, mask, "bool")
    inner = math.prod(tail)
    step = 0 if is_value(rows, 1) else inner
    extern(ctx, templates_scatter.masked_put(bool(accumulate)),
           [out.layout.buffer, v.layout.buffer, m.layout.buffer], [mask.numel, inner, step],
           x.numel, 3 * x.numel, writes=(out.layout.buffer,))
    return out


@register(aten.masked_scatter_backward.default)
def _masked_scatter_backward(ctx: GraphLowering, grad: TensorValue, mask: TensorValue,
                             sizes: list[int]) -> TensorValue:
    """The source's gradient: the output gradient where ``mask`` is set, in row-major
    order, then zeros (the source elements masked_scatter did not use)."""
    g = dense(ctx, grad)
    m = dense(ctx, expand(mask, list(grad.shape)), "bool")
    out = ctx.new_tensor(tuple(sizes), g.dtype)
    extern(ctx, templates_scatter.masked_gather(), [out.layout.buffer, g.layout.buffer,
                                                    m.layout.buffer],
           [g.numel, out.numel], g.numel, 3 * g.numel, writes=(out.layout.buffer,))
    return as_dtype(out, grad.dtype)

"""Sorting lowerings: sort, argsort, top-k, k-th value, median, searchsorted, bucketize.

Each runs one template over the rows of a dense copy of its input (16-bit floats are
sorted as float32, exactly: a bfloat16 value is a float32 value). Sorting is stable;
eager's default CPU sort is not, so indices of equal values may differ from eager's
(both are valid orders; torch documents the order of equal elements as unspecified).
"""
from __future__ import annotations

from typing import Any

import torch

from simaccel.codegen import templates_sort as tpl
from simaccel.codegen.dtypes import compute_dtype, is_float
from simaccel.codegen.graph import GraphLowering, Unsupported, extern
from simaccel.codegen.operands import as_dtype, dense, rows
from simaccel.codegen.registry import register
from simaccel.codegen.sizes import hint, is_value
from simaccel.codegen.values import Realized, TensorValue

aten = torch.ops.aten

#: rows at least this many elements in total are sorted in parallel.
PARALLEL_NUMEL = 1 << 16


def _key(x: TensorValue) -> str:
    """The dtype ``x`` is sorted as: bool as int8, 16-bit floats as float32."""
    dtype = compute_dtype(x.dtype)
    return "int8" if dtype == "bool" else dtype


def _results(value: Realized, dtype: str) -> TensorValue:
    return as_dtype(value, dtype)


def _sort(ctx: GraphLowering, x: TensorValue, dim: int, descending: bool
          ) -> tuple[TensorValue, Realized]:
    key = _key(x)
    xr = dense(ctx, x)
    vals = ctx.new_tensor(x.shape, xr.dtype)
    idx = ctx.new_tensor(x.shape, "int64")
    outer, n, inner = rows(x.shape, dim)
    extern(ctx, tpl.sort(is_float(key), key),
           [vals.layout.buffer, idx.layout.buffer, xr.layout.buffer],
           [outer, n, inner, int(bool(descending))], 20 * x.numel, 24 * x.numel,
           hint(x.numel) >= PARALLEL_NUMEL and hint(outer * inner) > 1,
           writes=(vals.layout.buffer, idx.layout.buffer))
    return _results(vals, x.dtype), idx


@register(aten.sort.default)
def _sort_default(ctx: GraphLowering, x: TensorValue, dim: int = -1,
                  descending: bool = False) -> tuple:
    return _sort(ctx, x, dim, descending)


@register(aten.sort.stable)
def _sort_stable(ctx: GraphLowering, x: TensorValue, *, stable: Any = None, dim: int = -1,
                 descending: bool = False) -> tuple:
    return _sort(ctx, x, dim, descending)


@register(aten.argsort.default, aten.argsort.stable)
def _argsort(ctx: GraphLowering, x: TensorValue, *args: Any, **kwargs: Any) -> Realized:
    if ctx.current.target is aten.argsort.stable:
        dim, descending = kwargs.get("dim", -1), kwargs.get("descending", False)
    else:
        dim = args[0] if args else kwargs.get("dim", -1)
        descending = args[1] if len(args) > 1 else kwargs.get("descending", False)
    return _sort(ctx, x, dim, descending)[1]


@register(aten.topk.default)
def _topk(ctx: GraphLowering, x: TensorValue, k: int, dim: int = -1, largest: bool = True,
          sorted: bool = True) -> tuple:
    """The ``k`` largest (smallest) along ``dim``, always in order (``sorted=False``
    leaves the order unspecified: sorted is one valid order)."""
    key = _key(x)
    xr = dense(ctx, x)
    shape = ctx.out_shape()
    vals, idx = ctx.new_tensor(shape, xr.dtype), ctx.new_tensor(shape, "int64")
    outer, n, inner = rows(x.shape, dim)
    extern(ctx, tpl.topk(is_float(key), key),
           [vals.layout.buffer, idx.layout.buffer, xr.layout.buffer],
           [outer, n, inner, k, int(bool(largest))], 4 * x.numel, 4 * x.numel,
           hint(x.numel) >= PARALLEL_NUMEL and hint(outer * inner) > 1,
           writes=(vals.layout.buffer, idx.layout.buffer))
    return _results(vals, x.dtype), idx


def _select(ctx: GraphLowering, x: TensorValue, dim: int, keepdim: bool, k: int,
            mode: int, dtype: str | None = None) -> tuple:
    """The selected values (as ``dtype``, by default ``x``'s) and their indices."""
    key = _key(x)
    xr = dense(ctx, x)
    outer, n, inner = rows(x.shape, dim)
    d = dim % max(x.ndim, 1)
    kept = tuple(1 if j == d else s for j, s in enumerate(x.shape)) if keepdim \
        else tuple(s for j, s in enumerate(x.shape) if j != d)
    vals, idx = ctx.new_tensor(kept, xr.dtype), ctx.new_tensor(kept, "int64")
    extern(ctx, tpl.select(key), [vals.layout.buffer, idx.layout.buffer, xr.layout.buffer],
           [outer, n, inner, k, mode], 20 * x.numel, 8 * x.numel,
           hint(x.numel) >= PARALLEL_NUMEL and hint(outer * inner) > 1,
           writes=(vals.layout.buffer, idx.layout.buffer))
    return _results(vals, dtype or x.dtype), idx


@register(aten.kthvalue.default)
def _kthvalue(ctx: GraphLowering, x: TensorValue, k: int, dim: int = -1,
              keepdim: bool = False) -> tuple:
    return _select(ctx, x, dim, keepdim, k, tpl.KTH)


@register(aten.median.dim, aten.nanmedian.dim)
def _median_dim(ctx: GraphLowering, x: TensorValue, dim: int, keepdim: bool = False) -> tuple:
    mode = tpl.MEDIAN if ctx.current.target is aten.median.dim else tpl.NANMEDIAN
    return _select(ctx, x, dim, keepdim, 0, mode)


@register(aten.median.default, aten.nanmedian.default)
def _median_all(ctx: GraphLowering, x: TensorValue) -> TensorValue:
    mode = tpl.MEDIAN if ctx.current.target is aten.median.default else tpl.NANMEDIAN
    if is_value(x.numel, 0):
        raise Unsupported("median of an empty tensor")
    flat = dense(ctx, x).restrided((x.numel,), (1,), 0)  # 16-bit floats: as float32
    return _select(ctx, flat, 0, False, 0, mode, x.dtype)[0]


def _search(ctx: GraphLowering, seq: TensorValue, values: TensorValue, right: bool,
            sorter: TensorValue | None, out_int32: bool) -> Realized:
    dtype = compute_dtype(torch_result(seq.dtype, values.dtype))
    s, v = dense(ctx, seq, dtype), dense(ctx, values, dtype)
    out = ctx.new_tensor(values.shape, "int32" if out_int32 else "int64")
    m = seq.shape[-1] if seq.ndim else 1
    length = values.shape[-1] if values.ndim else 1
    rows_ = values.numel // length if values.ndim and not is_value(length, 0) else 1
    seq_rows = 1 if seq.ndim <= 1 else rows_
    buffers = [out.layout.buffer, s.layout.buffer, v.layout.buffer]
    if sorter is not None:
        buffers.append(dense(ctx, sorter, "int64").layout.buffer)
    extern(ctx, tpl.searchsorted(right, sorter is not None), buffers,
           [rows_, m, length, seq_rows], values.numel * 16, 8 * values.numel,
           writes=(out.layout.buffer,))
    return out


def torch_result(a: str, b: str) -> str:
    """The promoted dtype of two tensors' dtypes (numpy names)."""
    return str(torch.promote_types(getattr(torch, a), getattr(torch, b))).replace("torch.", "")


@register(aten.searchsorted.Tensor)
def _searchsorted(ctx: GraphLowering, seq: TensorValue, values: TensorValue, *,
                  out_int32: bool = False, right: bool = False, side: Any = None,
                  sorter: Any = None) -> Realized:
    right = right or side == "right"
    return _search(ctx, seq, values, right, sorter, out_int32)


@register(aten.bucketize.Tensor)
def _bucketize(ctx: GraphLowering, x: TensorValue, boundaries: TensorValue, *,
               out_int32: bool = False, right: bool = False) -> Realized:
    return _search(ctx, boundaries, x, right, None, out_int32)

"""Scan lowerings: cumsum, cumprod, cummax, cummin, logcumsumexp. One template launch over
the rows of a dense copy of the input; 16-bit floats scan in float32 (cumsum/cumprod
accumulate in float64, as for float32) and are rounded once by the consumer."""
from __future__ import annotations

from typing import Any

import torch

from simaccel.codegen import templates, templates_scan
from simaccel.codegen.dtypes import compute_dtype, is_float
from simaccel.codegen.graph import GraphLowering, extern
from simaccel.codegen.operands import as_dtype, dense, rows
from simaccel.codegen.registry import register
from simaccel.codegen.sizes import hint
from simaccel.codegen.values import TensorValue

aten = torch.ops.aten

#: scans over at least this many elements run their rows in parallel.
PARALLEL_NUMEL = 1 << 20


def _parallel(x: TensorValue, outer: Any, inner: Any) -> bool:
    return hint(x.numel) >= PARALLEL_NUMEL and hint(outer * inner) > 1


@register(aten.cumsum.default, aten.cumprod.default)
def _cumsum(ctx: GraphLowering, x: TensorValue, dim: int, dtype: Any = None) -> TensorValue:
    """torch converts each element to the result dtype first (cumsum(x, dtype=int64)
    truncates), then accumulates (in float64 for floats)."""
    out_dtype = ctx.out_dtype()
    work = compute_dtype(out_dtype)
    xr = dense(ctx, as_dtype(x, out_dtype), work)
    out = ctx.new_tensor(x.shape, work)
    outer, n, inner = rows(x.shape, dim)
    op = "sum" if ctx.current.target is aten.cumsum.default else "prod"
    acc = "np.float64" if is_float(work) else "np.int64"
    extern(ctx, templates.scan(op, acc), [out.layout.buffer, xr.layout.buffer],
           [outer, n, inner], x.numel, 8 * x.numel, _parallel(x, outer, inner),
           writes=(out.layout.buffer,))
    return as_dtype(out, out_dtype)


@register(aten.cummax.default, aten.cummin.default)
def _cummax(ctx: GraphLowering, x: TensorValue, dim: int) -> tuple:
    xr = dense(ctx, x)
    vals, idx = ctx.new_tensor(x.shape, xr.dtype), ctx.new_tensor(x.shape, "int64")
    outer, n, inner = rows(x.shape, dim)
    source = templates_scan.cumextreme(ctx.current.target is aten.cummax.default,
                                       is_float(xr.dtype))
    extern(ctx, source, [vals.layout.buffer, idx.layout.buffer, xr.layout.buffer],
           [outer, n, inner], x.numel, 12 * x.numel, _parallel(x, outer, inner),
           writes=(vals.layout.buffer, idx.layout.buffer))
    return as_dtype(vals, x.dtype), idx


@register(aten.logcumsumexp.default)
def _logcumsumexp(ctx: GraphLowering, x: TensorValue, dim: int) -> TensorValue:
    xr = dense(ctx, x)
    out = ctx.new_tensor(x.shape, xr.dtype)
    outer, n, inner = rows(x.shape, dim)
    extern(ctx, templates_scan.logcumsumexp(), [out.layout.buffer, xr.layout.buffer],
           [outer, n, inner], 4 * x.numel, 8 * x.numel, _parallel(x, outer, inner),
           writes=(out.layout.buffer,))
    return as_dtype(out, x.dtype)

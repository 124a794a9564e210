"""Pooling lowerings: max, average, adaptive average and adaptive max pooling in 2 and 3
spatial dims (1-d pooling reaches ATen as 2-d), forward and backward
(:mod:`.templates_pool`). 16-bit floats pool in float32 (max pooling is exact)."""
from __future__ import annotations

from typing import Any

import torch

from simaccel.codegen import templates_pool as tpl
from simaccel.codegen.dtypes import compute_dtype, is_float
from simaccel.codegen.graph import GraphLowering, Unsupported, extern
from simaccel.codegen.operands import as_dtype, dense
from simaccel.codegen.registry import register
from simaccel.codegen.sizes import hint
from simaccel.codegen.values import Realized, TensorValue

aten = torch.ops.aten

#: tensors at least this large (elements) pool their planes in parallel.
PARALLEL_NUMEL = 1 << 20


def _planes(shape: tuple, nd: int) -> tuple[Any, list[Any]]:
    """(planes, [D, H, W]) of a tensor pooled over its last ``nd`` dims."""
    if len(shape) < nd + 1:
        raise Unsupported(f"{nd}-d pooling of a {len(shape)}-d tensor")
    planes = 1
    for s in shape[:-nd]:
        planes = planes * s
    return planes, [1] * (3 - nd) + list(shape[-nd:])


def _three(values: Any, nd: int, fill: int, default: Any = None) -> list[Any]:
    """A kernel/stride/padding/dilation argument as 3 values (one value is every dim's)."""
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    if not values:
        values = list(default)
    values = values * nd if len(values) == 1 else values
    return [fill] * (3 - nd) + values


def _window(x_shape: tuple, out_shape: tuple, nd: int, kernel: Any, stride: Any,
            padding: Any) -> list[Any]:
    planes, spatial = _planes(x_shape, nd)
    _, out_spatial = _planes(out_shape, nd)
    return [planes, *spatial, *out_spatial, *_three(kernel, nd, 1),
            *_three(stride, nd, 1, default=kernel), *_three(padding, nd, 0)]


def _input(ctx: GraphLowering, x: TensorValue) -> Realized:
    work = compute_dtype(x.dtype)
    if not is_float(work):
        raise Unsupported(f"pooling on {x.dtype}")
    return dense(ctx, x, work)


def _parallel(x: TensorValue) -> bool:
    return hint(x.numel) >= PARALLEL_NUMEL


def _max_pool(ctx: GraphLowering, x: TensorValue, nd: int, kernel: Any, stride: Any,
              padding: Any, dilation: Any) -> tuple:
    xr = _input(ctx, x)
    shape = ctx.out_shape()
    out, idx = ctx.new_tensor(shape, xr.dtype), ctx.new_tensor(shape, "int64")
    params = _window(x.shape, shape, nd, kernel, stride, padding) + _three(dilation, nd, 1)
    extern(ctx, tpl.max_pool(), [out.layout.buffer, idx.layout.buffer, xr.layout.buffer],
           params, out.numel * 8, 4 * (x.numel + 3 * out.numel), _parallel(x),
           writes=(out.layout.buffer, idx.layout.buffer))
    return as_dtype(out, x.dtype), idx


@register(aten.max_pool2d_with_indices.default)
def _max_pool2d(ctx: GraphLowering, x: TensorValue, kernel: list[int], stride: list[int] = (),
                padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> tuple:
    return _max_pool(ctx, x, 2, kernel, stride, padding, dilation)


@register(aten.max_pool3d_with_indices.default)
def _max_pool3d(ctx: GraphLowering, x: TensorValue, kernel: list[int], stride: list[int] = (),
                padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> tuple:
    return _max_pool(ctx, x, 3, kernel, stride, padding, dilation)


def _scatter_back(ctx: GraphLowering, go: TensorValue, x: TensorValue, indices: TensorValue,
                  nd: int) -> TensorValue:
    gor, idxr = _input(ctx, go), dense(ctx, indices, "int64")
    gx = ctx.new_tensor(x.shape, gor.dtype)
    planes, spatial = _planes(x.shape, nd)
    _, out_spatial = _planes(go.shape, nd)
    extern(ctx, tpl.scatter_by_index(), [gx.layout.buffer, gor.layout.buffer, idxr.layout.buffer],
           [planes, spatial[0] * spatial[1] * spatial[2],
            out_spatial[0] * out_spatial[1] * out_spatial[2]],
           go.numel, 4 * (x.numel + 3 * go.numel), _parallel(x), writes=(gx.layout.buffer,))
    return as_dtype(gx, go.dtype)


@register(aten.max_pool2d_with_indices_backward.default,
          aten.max_pool3d_with_indices_backward.default)
def _max_pool_backward(ctx: GraphLowering, go: TensorValue, x: TensorValue, kernel: Any,
                       stride: Any, padding: Any, dilation: Any, ceil_mode: bool,
                       indices: TensorValue) -> TensorValue:
    nd = 2 if ctx.current.target is aten.max_pool2d_with_indices_backward.default else 3
    return _scatter_back(ctx, go, x, indices, nd)


@register(aten.adaptive_max_pool2d_backward.default, aten.adaptive_max_pool3d_backward.default)
def _adaptive_max_backward(ctx: GraphLowering, go: TensorValue, x: TensorValue,
                           indices: TensorValue) -> TensorValue:
    nd = 2 if ctx.current.target is aten.adaptive_max_pool2d_backward.default else 3
    return _scatter_back(ctx, go, x, indices, nd)


def _avg_params(x_shape: tuple, out_shape: tuple, nd: int, kernel: Any, stride: Any,
                padding: Any, count_include_pad: bool, divisor_override: Any) -> list[Any]:
    return _window(x_shape, out_shape, nd, kernel, stride, padding) + [
        int(count_include_pad), int(divisor_override or 0)]


@register(aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool(ctx: GraphLowering, x: TensorValue, kernel: list[int], stride: list[int] = (),
              padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
              divisor_override: Any = None) -> TensorValue:
    nd = 2 if ctx.current.target is aten.avg_pool2d.default else 3
    xr = _input(ctx, x)
    shape = ctx.out_shape()
    out = ctx.new_tensor(shape, xr.dtype)
    params = _avg_params(x.shape, shape, nd, kernel, stride, padding, count_include_pad,
                         divisor_override)
    extern(ctx, tpl.avg_pool(), [out.layout.buffer, xr.layout.buffer], params, x.numel,
           4 * (x.numel + out.numel), _parallel(x), writes=(out.layout.buffer,))
    return as_dtype(out, x.dtype)


@register(aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default)
def _avg_pool_backward(ctx: GraphLowering, go: TensorValue, x: TensorValue, kernel: Any,
                       stride: Any, padding: Any, ceil_mode: bool, count_include_pad: bool,
                       divisor_override: Any) -> TensorValue:
    nd = 2 if ctx.current.target is aten.avg_pool2d_backward.default else 3
    gor = _input(ctx, go)
    gx = ctx.new_tensor(x.shape, gor.dtype)
    params = _avg_params(x.shape, go.shape, nd, kernel, stride, padding, count_include_pad,
                         divisor_override)
    extern(ctx, tpl.avg_pool_backward(), [gx.layout.buffer, gor.layout.buffer], params,
           x.numel, 4 * (x.numel + go.numel), _parallel(x), writes=(gx.layout.buffer,))
    return as_dtype(gx, go.dtype)


def _adaptive(ctx: GraphLowering, source: str, x: TensorValue, out_shape: tuple, nd: int,
              with_indices: bool) -> tuple:
    xr = _input(ctx, x)
    out = ctx.new_tensor(out_shape, xr.dtype)
    outs = [out] + ([ctx.new_tensor(out_shape, "int64")] if with_indices else [])
    planes, spatial = _planes(x.shape, nd)
    _, out_spatial = _planes(out_shape, nd)
    extern(ctx, source, [o.layout.buffer for o in outs] + [xr.layout.buffer],
           [planes, *spatial, *out_spatial], x.numel, 4 * (x.numel + out.numel),
           _parallel(x), writes=tuple(o.layout.buffer for o in outs))
    return (as_dtype(out, x.dtype), *outs[1:])


@register(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def _adaptive_avg(ctx: GraphLowering, x: TensorValue, output_size: list[int]) -> TensorValue:
    nd = 2 if ctx.current.target is aten._adaptive_avg_pool2d.default else 3
    return _adaptive(ctx, tpl.adaptive_avg_pool(), x, ctx.out_shape(), nd, False)[0]


@register(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def _adaptive_max(ctx: GraphLowering, x: TensorValue, output_size: list[int]) -> tuple:
    nd = 2 if ctx.current.target is aten.adaptive_max_pool2d.default else 3
    return _adaptive(ctx, tpl.adaptive_max_pool(), x, ctx.out_shape(), nd, True)


@register(aten._adaptive_avg_pool2d_backward.default, aten._adaptive_avg_pool3d_backward.default)
def _adaptive_avg_backward(ctx: GraphLowering, go: TensorValue, x: TensorValue) -> TensorValue:
    nd = 2 if ctx.current.target is aten._adaptive_avg_pool2d_backward.default else 3
    gor = _input(ctx, go)
    gx = ctx.new_tensor(x.shape, gor.dtype)
    planes, spatial = _planes(x.shape, nd)
    _, out_spatial = _planes(go.shape, nd)
    extern(ctx, tpl.adaptive_avg_pool_backward(), [gx.layout.buffer, gor.layout.buffer],
           [planes, *spatial, *out_spatial], x.numel, 4 * (x.numel + go.numel), _parallel(x),
           writes=(gx.layout.buffer,))
    return as_dtype(gx, go.dtype)

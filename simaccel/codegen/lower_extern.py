"""Lowerings to template kernels: matmul, convolution, pooling, scans."""
from __future__ import annotations

from typing import Any

import torch

from simaccel.codegen import library, templates
from simaccel.codegen.graph import GraphLowering, Unsupported, extern
from simaccel.codegen.dtypes import is_float
from simaccel.codegen.ir import LibraryKernel, Op
from simaccel.codegen.lower_reduce import reduce
from simaccel.codegen.lowering import elementwise
from simaccel.codegen.registry import register
from simaccel.codegen.values import Lazy, Realized, TensorValue, cast

aten = torch.ops.aten

#: tensors at least this large (elements) run their template with prange.
PARALLEL_NUMEL = 1 << 20


def _matrix_operand(ctx: GraphLowering, x: TensorValue, dtype: str) -> tuple[Realized, bool, int]:
    """(buffer, transposed, batch stride) for the last two dims of ``x`` as a matrix."""
    if x.dtype != dtype:
        x = Lazy(x.shape, dtype, lambda i, x=x: cast(x.load(i), dtype), 1)
    if isinstance(x, Realized):
        rows, cols = x.shape[-2], x.shape[-1]
        s_r, s_c = x.layout.strides[-2], x.layout.strides[-1]
        batch = x.layout.strides[0] if x.ndim == 3 else 0
        batch_ok = x.ndim == 2 or x.shape[0] == 1 or batch == 0 or batch >= rows * cols
        if batch_ok and (s_c == 1 or cols == 1) and (s_r == cols or rows == 1):
            return x, False, (0 if x.ndim == 3 and x.shape[0] == 1 else batch)
        if batch_ok and (s_r == 1 or rows == 1) and (s_c == rows or cols == 1):
            return x, True, (0 if x.ndim == 3 and x.shape[0] == 1 else batch)
    x = ctx.realize_contiguous(x)
    return x, False, (x.shape[-2] * x.shape[-1] if x.ndim == 3 else 0)


def matmul(ctx: GraphLowering, a: TensorValue, b: TensorValue, dtype: str) -> Realized:
    """``a @ b`` for 2-D or 3-D (batched) operands into a new contiguous buffer."""
    batch = a.shape[0] if a.ndim == 3 else 1
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    out = ctx.new_tensor((batch, m, n) if a.ndim == 3 else (m, n), dtype)
    ra, a_t, a_bs = _matrix_operand(ctx, a, dtype)
    rb, b_t, b_bs = _matrix_operand(ctx, b, dtype)
    buffers = [out.layout.buffer, ra.layout.buffer, rb.layout.buffer]
    params = [batch, m, k, n, ra.layout.offset, a_bs, rb.layout.offset, b_bs]
    flops, nbytes = 2 * batch * m * n * k, 4 * (batch * (m * k + k * n + m * n))
    if dtype in library.GEMM_DTYPES:  # a BLAS call on the device buffers: no JIT compile
        ctx.add_kernel(LibraryKernel(ctx.kernel_name("gemm"), library.gemm, buffers,
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
           beta: Any = 1, alpha: Any = 1) -> Lazy:
    product = matmul(ctx, a, b, ctx.out_dtype())
    scaled = product if alpha == 1 else elementwise(ctx, "mul", [product, alpha])
    if beta == 0:
        return elementwise(ctx, "identity", [scaled])
    scaled_bias = bias if beta == 1 else elementwise(ctx, "mul", [bias, beta])
    return elementwise(ctx, "add", [scaled_bias, scaled])


def _conv_geometry(x: TensorValue, w: TensorValue, out_shape: tuple[int, ...],
                   stride: list[int], padding: list[int], dilation: list[int],
                   groups: int) -> list[int]:
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    return [n, c, h, wd, o, kh, kw, stride[0], stride[1], padding[0], padding[1],
            dilation[0], dilation[1], groups, out_shape[2], out_shape[3]]


def _check_conv(x: TensorValue, transposed: bool, dtype: str) -> None:
    if transposed:
        raise Unsupported("transposed convolution has no device template")
    if x.ndim != 4:
        raise Unsupported(f"only 2-d convolution runs on the device (input is {x.ndim}-d)")
    if not is_float(dtype):
        raise Unsupported(f"convolution on {dtype}")


@register(aten.convolution.default)
def _convolution(ctx: GraphLowering, x: TensorValue, w: TensorValue, bias: Any,
                 stride: list[int], padding: list[int], dilation: list[int], transposed: bool,
                 output_padding: list[int], groups: int) -> TensorValue:
    dtype = ctx.out_dtype()
    _check_conv(x, transposed, dtype)
    shape = ctx.out_shape()
    geom = _conv_geometry(x, w, shape, stride, padding, dilation, groups)
    xr, wr = _dense(ctx, x), _dense(ctx, w)
    rows = (x.shape[1] // groups) * w.shape[2] * w.shape[3]
    cols = ctx.new_buffer(dtype, rows * shape[2] * shape[3])
    out = ctx.new_tensor(shape, dtype)
    flops = 2 * out.numel * rows
    extern(ctx, templates.conv2d(), [out.layout.buffer, xr.layout.buffer, wr.layout.buffer, cols],
           geom, flops, 4 * (x.numel + w.numel + out.numel), writes=(out.layout.buffer, cols))
    if bias is None:
        return out
    return Lazy(shape, dtype, lambda i: elementwise_add_bias(out, bias, i, dtype), 1)


def elementwise_add_bias(out: Realized, bias: TensorValue, index: list[str], dtype: str):
    return Op("add", (out.load(index), cast(bias.load([index[1]]), dtype)), dtype)


def _dense(ctx: GraphLowering, value: TensorValue) -> Realized:
    """Templates index from element 0 of a contiguous buffer: copy anything else."""
    if isinstance(value, Realized) and value.is_contiguous() and value.layout.offset == 0:
        return value
    return ctx.realize_contiguous_copy(value)


@register(aten.convolution_backward.default)
def _convolution_backward(ctx: GraphLowering, go: TensorValue, x: TensorValue, w: TensorValue,
                          bias_sizes: Any, stride: list[int], padding: list[int],
                          dilation: list[int], transposed: bool, output_padding: list[int],
                          groups: int, output_mask: list[bool]) -> tuple:
    dtype = x.dtype
    _check_conv(x, transposed, dtype)
    gor, xr, wr = (_dense(ctx, v) for v in (go, x, w))
    geom = _conv_geometry(x, w, go.shape, stride, padding, dilation, groups)
    rows = (x.shape[1] // groups) * w.shape[2] * w.shape[3]
    length = go.shape[2] * go.shape[3]
    gx = ctx.new_tensor(x.shape, dtype)
    gw = ctx.new_tensor(w.shape, dtype)
    cols, gcols = ctx.new_buffer(dtype, rows * length), ctx.new_buffer(dtype, rows * length)
    want_gx, want_gw = bool(output_mask[0]), bool(output_mask[1])
    extern(ctx, templates.conv2d_backward(),
           [gx.layout.buffer, gw.layout.buffer, gor.layout.buffer, xr.layout.buffer,
            wr.layout.buffer, cols, gcols], geom + [int(want_gx), int(want_gw)],
           4 * go.numel * rows, 4 * (x.numel + w.numel + 2 * go.numel),
           writes=(gx.layout.buffer, gw.layout.buffer, cols, gcols))
    gb = None
    if output_mask[2]:
        gb = reduce(ctx, go, [0, 2, 3], False, "sum", dtype)
    return (gx if want_gx else None, gw if want_gw else None, gb)


def _pool_args(x: TensorValue, out_shape: tuple[int, ...], kernel: list[int], stride: list[int],
               padding: list[int]) -> list[int]:
    n, c, h, w = _as_4d(x.shape)
    stride = list(stride) or list(kernel)
    kernel = list(kernel) * (2 // len(kernel))
    stride = stride * (2 // len(stride))
    padding = list(padding) * (2 // len(padding))
    return [n * c, h, w, out_shape[-2], out_shape[-1], kernel[0], kernel[1], stride[0],
            stride[1], padding[0], padding[1]]


def _as_4d(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    if len(shape) == 3:
        return (1,) + tuple(shape)  # type: ignore[return-value]
    if len(shape) != 4:
        raise Unsupported(f"2-d pooling of a {len(shape)}-d tensor")
    return tuple(shape)  # type: ignore[return-value]


def _parallel(numel: int) -> bool:
    return numel >= PARALLEL_NUMEL


@register(aten.max_pool2d_with_indices.default)
def _max_pool(ctx: GraphLowering, x: TensorValue, kernel: list[int], stride: list[int] = (),
              padding: list[int] = (0,), dilation: list[int] = (1,), ceil_mode: bool = False):
    if not is_float(x.dtype):
        raise Unsupported(f"max pooling on {x.dtype}")
    xr = _dense(ctx, x)
    shape = ctx.out_shape()
    dil = list(dilation) * (2 // len(dilation))
    out, idx = ctx.new_tensor(shape, x.dtype), ctx.new_tensor(shape, "int64")
    extern(ctx, templates.max_pool2d(), [out.layout.buffer, idx.layout.buffer, xr.layout.buffer],
           _pool_args(x, shape, kernel, stride, padding) + dil, out.numel * kernel[0] * kernel[-1],
           4 * (x.numel + 3 * out.numel), _parallel(x.numel),
           writes=(out.layout.buffer, idx.layout.buffer))
    return (out, idx)


@register(aten.max_pool2d_with_indices_backward.default)
def _max_pool_backward(ctx: GraphLowering, go: TensorValue, x: TensorValue, kernel: list[int],
                       stride: list[int], padding: list[int], dilation: list[int],
                       ceil_mode: bool, indices: TensorValue) -> Realized:
    gor, idxr = _dense(ctx, go), _dense(ctx, indices)
    gx = ctx.new_tensor(x.shape, go.dtype)
    n, c, h, w = _as_4d(x.shape)
    extern(ctx, templates.max_pool2d_backward(),
           [gx.layout.buffer, gor.layout.buffer, idxr.layout.buffer],
           [n * c, h * w, go.shape[-2] * go.shape[-1]], go.numel, 4 * (x.numel + 3 * go.numel),
           _parallel(x.numel), writes=(gx.layout.buffer,))
    return gx


def _avg_params(x, shape, kernel, stride, padding, count_include_pad, divisor_override):
    return _pool_args(x, shape, kernel, stride, padding) + [
        int(count_include_pad), int(divisor_override or 0)]


@register(aten.avg_pool2d.default)
def _avg_pool(ctx: GraphLowering, x: TensorValue, kernel: list[int], stride: list[int] = (),
              padding: list[int] = (0,), ceil_mode: bool = False, count_include_pad: bool = True,
              divisor_override: Any = None) -> Realized:
    if not is_float(x.dtype):
        raise Unsupported(f"avg pooling on {x.dtype}")
    xr = _dense(ctx, x)
    shape = ctx.out_shape()
    out = ctx.new_tensor(shape, x.dtype)
    params = _avg_params(x, shape, kernel, stride, padding, count_include_pad, divisor_override)
    extern(ctx, templates.avg_pool2d(), [out.layout.buffer, xr.layout.buffer], params,
           out.numel * kernel[0] * kernel[-1], 4 * (x.numel + out.numel), _parallel(x.numel),
           writes=(out.layout.buffer,))
    return out


@register(aten.avg_pool2d_backward.default)
def _avg_pool_backward(ctx: GraphLowering, go: TensorValue, x: TensorValue, kernel: list[int],
                       stride: list[int], padding: list[int], ceil_mode: bool,
                       count_include_pad: bool, divisor_override: Any) -> Realized:
    gor = _dense(ctx, go)
    gx = ctx.new_tensor(x.shape, go.dtype)
    params = _avg_params(x, go.shape, kernel, stride, padding, count_include_pad,
                         divisor_override)
    extern(ctx, templates.avg_pool2d_backward(), [gx.layout.buffer, gor.layout.buffer], params,
           x.numel, 4 * (x.numel + go.numel), _parallel(x.numel), writes=(gx.layout.buffer,))
    return gx


@register(aten._adaptive_avg_pool2d.default)
def _adaptive_avg(ctx: GraphLowering, x: TensorValue, output_size: list[int]) -> Realized:
    if not is_float(x.dtype):
        raise Unsupported(f"adaptive avg pooling on {x.dtype}")
    xr = _dense(ctx, x)
    shape = ctx.out_shape()
    out = ctx.new_tensor(shape, x.dtype)
    n, c, h, w = _as_4d(x.shape)
    extern(ctx, templates.adaptive_avg_pool2d(), [out.layout.buffer, xr.layout.buffer],
           [n * c, h, w, shape[-2], shape[-1]], x.numel, 4 * (x.numel + out.numel),
           _parallel(x.numel), writes=(out.layout.buffer,))
    return out


@register(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_backward(ctx: GraphLowering, go: TensorValue, x: TensorValue) -> Realized:
    gor = _dense(ctx, go)
    gx = ctx.new_tensor(x.shape, go.dtype)
    n, c, h, w = _as_4d(x.shape)
    extern(ctx, templates.adaptive_avg_pool2d_backward(), [gx.layout.buffer, gor.layout.buffer],
           [n * c, h, w, go.shape[-2], go.shape[-1]], x.numel, 4 * (x.numel + go.numel),
           _parallel(x.numel), writes=(gx.layout.buffer,))
    return gx


@register(aten.cumsum.default, aten.cumprod.default)
def _cumsum(ctx: GraphLowering, x: TensorValue, dim: int, dtype: Any = None) -> Realized:
    out_dtype = ctx.out_dtype()
    if x.dtype != out_dtype:  # torch converts each element first: cumsum(x, dtype=int64) truncates
        x = Lazy(x.shape, out_dtype, lambda i, x=x: cast(x.load(i), out_dtype), 1)
    xr = _dense(ctx, x)
    out = ctx.new_tensor(x.shape, out_dtype)
    dim = dim % max(x.ndim, 1)
    outer = int(torch.Size(x.shape[:dim]).numel())
    inner = int(torch.Size(x.shape[dim + 1:]).numel())
    n = x.shape[dim] if x.ndim else 1
    op = "sum" if ctx.current.target is aten.cumsum.default else "prod"
    acc = "np.float64" if is_float(out_dtype) else "np.int64"
    extern(ctx, templates.scan(op, acc), [out.layout.buffer, xr.layout.buffer],
           [outer, n, inner], x.numel, 8 * x.numel, _parallel(x.numel) and outer > 1,
           writes=(out.layout.buffer,))
    return out

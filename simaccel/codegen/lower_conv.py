"""Convolution lowerings: 1-, 2- and 3-d, grouped, strided, padded, dilated, and
transposed, forward and backward (:mod:`.templates_conv`). 16-bit float convolutions
run in float32 (:mod:`.operands`); the bias is a fused epilogue.

A grouped convolution of static shape in float32/float64 is a library call instead
(:func:`~simaccel.codegen.lower_library.library_call`: ATen's convolution on tensors viewing
device memory, as inductor runs every convolution as an extern kernel): the template's
im2col and GEMM per (image, group) are many small products, several times slower than the
library's grouped kernel (``simaccel bench --scenarios grouped_conv``)."""
from __future__ import annotations

from typing import Any

import torch

from simaccel.codegen import templates_conv as tpl
from simaccel.codegen.dtypes import compute_dtype, is_float, storage_name
from simaccel.codegen.graph import GraphLowering, Unsupported, extern
from simaccel.codegen.ir import Expr, Op
from simaccel.codegen.lower_library import library_call
from simaccel.codegen.lower_reduce import reduce
from simaccel.codegen.operands import as_dtype, dense
from simaccel.codegen.registry import register
from simaccel.codegen.sizes import is_symbolic
from simaccel.codegen.values import Lazy, Realized, TensorValue, cast

aten = torch.ops.aten


def geometry(in_shape: tuple, w_shape: tuple, out_shape: tuple, stride: list[int],
             padding: list[int], dilation: list[int], groups: int) -> list[Any]:
    """The template parameters (:data:`.templates_conv.GEOMETRY`) of the convolution
    taking ``in_shape`` (N, C, *spatial) to ``out_shape`` with weight ``w_shape``
    (O, C/groups, *kernel): fewer than 3 spatial dims get size-1 leading ones."""
    nd = len(in_shape) - 2
    if not 1 <= nd <= 3:
        raise Unsupported(f"{nd}-d convolution")
    lead = 3 - nd

    def pad3(values: list[Any], fill: int) -> list[Any]:
        values = list(values) * (nd // len(values)) if len(values) != nd else list(values)
        return [fill] * lead + values
    spatial_in = pad3(list(in_shape[2:]), 1)
    kernel = pad3(list(w_shape[2:]), 1)
    spatial_out = pad3(list(out_shape[2:]), 1)
    return ([in_shape[0], in_shape[1], *spatial_in, w_shape[0], *kernel, *pad3(stride, 1),
             *pad3(padding, 0), *pad3(dilation, 1), groups, *spatial_out])


def _scratch(ctx: GraphLowering, dtype: str, in_channels: Any, groups: int, w_shape: tuple,
             out_shape: tuple) -> str:
    """The im2col buffer of one (image, group): (C/groups * kernel) x output positions."""
    rows = in_channels // groups
    for k in w_shape[2:]:
        rows = rows * k
    length = 1
    for s in out_shape[2:]:
        length = length * s
    return ctx.new_buffer(dtype, rows * length)


def _work_dtype(dtype: str) -> str:
    work = compute_dtype(dtype)
    if not is_float(work):
        raise Unsupported(f"convolution on {dtype}")
    return work


def _flops(out_numel: Any, w_shape: tuple) -> Any:
    per_output = 1
    for s in w_shape[1:]:
        per_output = per_output * s
    return 2 * out_numel * per_output


def _with_bias(out: Realized, bias: Any, dtype: str) -> TensorValue:
    if bias is None:
        return as_dtype(out, dtype)

    def fn(index: list[str]) -> Expr:
        total = Op("add", (out.load(index), cast(bias.load([index[1]]), out.dtype)), out.dtype)
        return cast(total, dtype)
    return Lazy(out.shape, dtype, fn, 2)


@register(aten.convolution.default)
def _convolution(ctx: GraphLowering, x: TensorValue, w: TensorValue, bias: Any,
                 stride: list[int], padding: list[int], dilation: list[int], transposed: bool,
                 output_padding: list[int], groups: int) -> TensorValue:
    if _library_conv(ctx, groups):
        return library_call(ctx, "conv", aten.convolution.default,
                            (x, w, bias, stride, padding, dilation, transposed,
                             output_padding, groups), {}, [ctx.meta(ctx.current)])[0]
    dtype = ctx.out_dtype()
    work = _work_dtype(dtype)
    shape = ctx.out_shape()
    xr, wr = dense(ctx, x, work), dense(ctx, w, work)
    out = ctx.new_tensor(shape, work)
    if not transposed:
        geom = geometry(x.shape, w.shape, shape, stride, padding, dilation, groups)
        cols = _scratch(ctx, work, x.shape[1], groups, w.shape, shape)
        source = tpl.conv_forward()
    else:  # the input gradient of the convolution from ``out``'s space to ``x``'s
        geom = geometry(shape, w.shape, x.shape, stride, padding, dilation, groups)
        cols = _scratch(ctx, work, shape[1], groups, w.shape, x.shape)
        source = tpl.conv_input_grad()
    extern(ctx, source, [out.layout.buffer, xr.layout.buffer, wr.layout.buffer, cols], geom,
           _flops(out.numel if not transposed else x.numel, w.shape),
           4 * (x.numel + w.numel + out.numel), writes=(out.layout.buffer, cols))
    return _with_bias(out, bias, dtype)


#: dtypes a grouped convolution runs in the library (16-bit floats stay on the template,
#: which computes in float32 as the rest of the device does)
LIBRARY_CONV_DTYPES = ("float32", "float64")


def _library_conv(ctx: GraphLowering, groups: Any) -> bool:
    """Whether the convolution being lowered runs as a library call (see the module doc)."""
    node = ctx.current
    values = [node.meta.get("val"), *(a.meta.get("val") for a in node.all_input_nodes)]
    tensors = [t for v in values for t in (v if isinstance(v, (list, tuple)) else [v])
               if isinstance(t, torch.Tensor)]
    return (isinstance(groups, int) and groups > 1 and bool(tensors)
            and all(storage_name(t.dtype) in LIBRARY_CONV_DTYPES for t in tensors)
            and not any(is_symbolic(d) for t in tensors for d in (*t.shape, *t.stride())))


def _grad(ctx: GraphLowering, source: str, out_shape: tuple, work: str, a: Realized,
          b: Realized, geom: list[Any], scratch_rows_of: tuple, flops: Any) -> Realized:
    """One gradient template: ``out = template(a, b)`` with an im2col scratch buffer."""
    out = ctx.new_tensor(out_shape, work)
    channels, groups, w_shape, spatial = scratch_rows_of
    cols = _scratch(ctx, work, channels, groups, w_shape, spatial)
    extern(ctx, source, [out.layout.buffer, a.layout.buffer, b.layout.buffer, cols], geom,
           flops, 4 * (a.numel + b.numel + out.numel), writes=(out.layout.buffer, cols))
    return out


@register(aten.convolution_backward.default)
def _convolution_backward(ctx: GraphLowering, go: TensorValue, x: TensorValue, w: TensorValue,
                          bias_sizes: Any, stride: list[int], padding: list[int],
                          dilation: list[int], transposed: bool, output_padding: list[int],
                          groups: int, output_mask: list[bool]) -> tuple:
    """(grad input, grad weight, grad bias), each only if ``output_mask`` asks for it. For a
    transposed convolution the roles swap: the convolution it transposes maps the output
    gradient's space to the input's."""
    if _library_conv(ctx, groups):
        return tuple(library_call(ctx, "conv", aten.convolution_backward.default,
                                  (go, x, w, bias_sizes, stride, padding, dilation, transposed,
                                   output_padding, groups, output_mask), {},
                                  list(ctx.meta(ctx.current))))
    work = _work_dtype(x.dtype)
    gor, xr, wr = dense(ctx, go, work), dense(ctx, x, work), dense(ctx, w, work)
    src, dst = (xr, gor) if not transposed else (gor, xr)  # forward conv: src -> dst
    geom = geometry(src.shape, w.shape, dst.shape, stride, padding, dilation, groups)
    scratch = (src.shape[1], groups, w.shape, dst.shape)
    flops = _flops(dst.numel, w.shape)
    gx = gw = gb = None
    if output_mask[0]:
        gx = _grad(ctx, tpl.conv_input_grad(), x.shape, work, gor, wr, geom, scratch, flops) \
            if not transposed else \
            _grad(ctx, tpl.conv_forward(), x.shape, work, gor, wr, geom, scratch, flops)
    if output_mask[1]:
        gw = _grad(ctx, tpl.conv_weight_grad(), w.shape, work, dst, src, geom, scratch, flops)
    if output_mask[2]:
        dims = [0] + list(range(2, go.ndim))
        gb = reduce(ctx, go, dims, False, "sum", compute_dtype(go.dtype))
    return tuple(None if g is None else as_dtype(g, x.dtype if g is not gb else go.dtype)
                 for g in (gx, gw, gb))

"""Reduction lowerings. The reduced value's producer (a lazy pointwise chain) is
inlined into the reduction loop, so ``(x * w + b).sum(-1)`` is one kernel."""
from __future__ import annotations

from typing import Any

import torch

from simaccel.codegen.graph import GraphLowering
from simaccel.codegen.dtypes import is_float
from simaccel.codegen.ir import Const, Expr, Op, ReductionKernel, affine, contiguous_strides
from simaccel.codegen.registry import register
from simaccel.codegen.sizes import Size, hint, is_symbolic, prod, source
from simaccel.codegen.values import Lazy, Realized, TensorValue, cast, load_broadcast

aten = torch.ops.aten


def _dims(x: TensorValue, dims: Any) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.ndim))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % x.ndim for d in dims}) if x.ndim else []


#: float32 rows of at most this many elements are summed in float32: the vectorised loop
#: keeps one partial sum per lane (16-64 of them), so each adds at most a few hundred
#: terms, an error like eager's own float32 accumulation, at twice the speed of float64.
#: Longer rows (and products) accumulate in float64.
FLOAT32_SUM_MAX = 4096


def _acc_dtype(op: str, in_dtype: str, out_dtype: str, length: Size) -> str:
    """The accumulator dtype. A row of dynamic length traced at most ``FLOAT32_SUM_MAX``
    long gets the float32 accumulator with a guard that it stays so (reported with the
    graph; a longer row recompiles with float64), as a static one would."""
    if op in ("any", "all"):
        return "bool"
    if op in ("sum", "mean") and in_dtype == out_dtype == "float32" \
            and hint(length) <= FLOAT32_SUM_MAX and bool(length <= FLOAT32_SUM_MAX):
        return "float32"
    if op in ("sum", "prod", "mean"):
        return "float64" if is_float(out_dtype) else "int64"
    return in_dtype


def reduce(ctx: GraphLowering, x: TensorValue, dims: list[int], keepdim: bool, op: str,
           out_dtype: str, body: Any = None, finalize: str = "") -> Realized:
    """Emit a reduction of ``x`` (or of ``body(index) -> Expr``) over ``dims``."""
    kept = [d for d in range(x.ndim) if d not in dims]
    out_shape = tuple(1 if d in dims else x.shape[d] for d in range(x.ndim)) if keepdim \
        else tuple(x.shape[d] for d in kept)
    out = ctx.new_tensor(out_shape, out_dtype)
    out_index = [f"o{k}" for k in range(len(kept))]
    red_index = [f"r{k}" for k in range(len(dims))]
    full = [""] * x.ndim
    for d, v in zip(kept, out_index):
        full[d] = v
    for d, v in zip(dims, red_index):
        full[d] = v
    in_op = "sum" if op == "mean" else op
    acc = _acc_dtype(op, x.dtype if body is None else "", out_dtype, _count(x, dims))
    value = body(full) if body is not None else x.load(full)
    if in_op not in ("argmax", "argmin", "any", "all"):
        value = cast(value, acc)
    loop_shape = tuple(x.shape[d] for d in kept)
    strides = contiguous_strides(loop_shape)
    offset_src = affine(list(zip(out_index, strides)))
    ctx.add_kernel(ReductionKernel(
        ctx.kernel_name("reduce"), out.layout, out_dtype, out_index, loop_shape, offset_src,
        red_index, tuple(x.shape[d] for d in dims), value, in_op, acc, finalize))
    return out


def _same_buffer_as(kept: Realized, shape: tuple[int, ...]) -> Realized:
    """A keepdim reduction result viewed without its size-1 dims (same buffer)."""
    return kept.restrided(shape, contiguous_strides(shape), 0)


def _count(x: TensorValue, dims: list[int]) -> Size:
    return prod(x.shape[d] for d in dims)


def _divide_by(n: Size, correction: float = 0.0) -> str:
    """A reduction's ``finalize`` dividing the accumulator by ``max(n - correction, 0)``
    (a float64 division; a dynamic ``n`` is a kernel argument)."""
    if not is_symbolic(n):
        return f"{{acc}} / np.float64({float(max(n - correction, 0))!r})"
    if not correction:
        return f"{{acc}} / np.float64({source(n)})"
    return f"{{acc}} / max(np.float64({source(n)}) - {float(correction)!r}, 0.0)"


@register(aten.sum.dim_IntList, aten.sum.default)
def _sum(ctx: GraphLowering, x: TensorValue, dim: Any = None, keepdim: bool = False,
         dtype: Any = None) -> Realized:
    return reduce(ctx, x, _dims(x, dim), keepdim, "sum", ctx.out_dtype())


@register(aten.mean.dim, aten.mean.default)
def _mean(ctx: GraphLowering, x: TensorValue, dim: Any = None, keepdim: bool = False,
          dtype: Any = None) -> Realized:
    dims = _dims(x, dim)
    n = _count(x, dims)
    return reduce(ctx, x, dims, keepdim, "mean", ctx.out_dtype(),
                  finalize=_divide_by(n))


@register(aten.prod.default, aten.prod.dim_int)
def _prod(ctx: GraphLowering, x: TensorValue, dim: Any = None, keepdim: bool = False,
          dtype: Any = None) -> Realized:
    return reduce(ctx, x, _dims(x, dim), keepdim, "prod", ctx.out_dtype())


@register(aten.amax.default, aten.amin.default)
def _amax(ctx: GraphLowering, x: TensorValue, dim: Any = (), keepdim: bool = False) -> Realized:
    op = "max" if ctx.current.target is aten.amax.default else "min"
    return reduce(ctx, x, _dims(x, dim), keepdim, op, ctx.out_dtype())


@register(aten.argmax.default, aten.argmin.default)
def _argmax(ctx: GraphLowering, x: TensorValue, dim: Any = None, keepdim: bool = False):
    op = "argmax" if ctx.current.target is aten.argmax.default else "argmin"
    if dim is None and keepdim:
        out = reduce(ctx, x, list(range(x.ndim)), True, op, "int64")
        return out
    return reduce(ctx, x, _dims(x, dim), keepdim, op, "int64")


@register(aten.max.dim, aten.min.dim)
def _max_dim(ctx: GraphLowering, x: TensorValue, dim: int, keepdim: bool = False):
    is_max = ctx.current.target is aten.max.dim
    dims = _dims(x, dim)
    values = reduce(ctx, x, dims, keepdim, "max" if is_max else "min", x.dtype)
    indices = reduce(ctx, x, dims, keepdim, "argmax" if is_max else "argmin", "int64")
    return (values, indices)


@register(aten.max.default, aten.min.default)
def _max_all(ctx: GraphLowering, x: TensorValue) -> Realized:
    op = "max" if ctx.current.target is aten.max.default else "min"
    return reduce(ctx, x, list(range(x.ndim)), False, op, x.dtype)


@register(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim,
          aten.all.dims)
def _any(ctx: GraphLowering, x: TensorValue, dim: Any = None, keepdim: bool = False):
    op = "any" if ctx.current.target in (aten.any.default, aten.any.dim, aten.any.dims) else "all"
    return reduce(ctx, x, _dims(x, dim), keepdim, op, "bool")


def _var(ctx: GraphLowering, x: TensorValue, dims: list[int], correction: float,
         keepdim: bool, out_dtype: str) -> tuple[Realized, Realized]:
    n = _count(x, dims)
    mean = reduce(ctx, x, dims, True, "mean", "float64" if is_float(out_dtype) else out_dtype,
                  finalize=_divide_by(n))

    def body(index: list[str]) -> Expr:
        diff = Op("sub", (cast(x.load(index), "float64"),
                          cast(load_broadcast(mean, x.shape, index), "float64")), "float64")
        return Op("mul", (diff, diff), "float64")
    var = reduce(ctx, x, dims, keepdim, "sum", out_dtype, body=body,
                 finalize=_divide_by(n, correction))
    if not keepdim:
        mean = _same_buffer_as(mean, var.shape)
    return var, mean


@register(aten.var.correction, aten.var.dim, aten.var.default)
def _var_op(ctx: GraphLowering, x: TensorValue, dim: Any = None, unbiased: Any = None,
            keepdim: bool = False, *, correction: Any = None) -> Realized:
    corr = _correction(unbiased, correction)
    return _var(ctx, x, _dims(x, dim), corr, keepdim, ctx.out_dtype())[0]


@register(aten.std.correction, aten.std.dim, aten.std.default)
def _std_op(ctx: GraphLowering, x: TensorValue, dim: Any = None, unbiased: Any = None,
            keepdim: bool = False, *, correction: Any = None) -> Lazy:
    var = _var(ctx, x, _dims(x, dim), _correction(unbiased, correction), keepdim,
               ctx.out_dtype())[0]
    return Lazy(var.shape, var.dtype, lambda i: Op("sqrt", (var.load(i),), var.dtype), 1)


@register(aten.var_mean.correction, aten.var_mean.dim)
def _var_mean(ctx: GraphLowering, x: TensorValue, dim: Any = None, unbiased: Any = None,
              keepdim: bool = False, *, correction: Any = None):
    out = ctx.out_dtype()
    var, mean = _var(ctx, x, _dims(x, dim), _correction(unbiased, correction), keepdim, out)
    mean_out = Lazy(var.shape, out, lambda i: cast(mean.load(i), out), 1)
    return (var, mean_out)


def _correction(unbiased: Any, correction: Any) -> float:
    if correction is not None:
        return float(correction)
    if isinstance(unbiased, bool):
        return 1.0 if unbiased else 0.0
    return 1.0


@register(aten.logsumexp.default)
def _logsumexp(ctx: GraphLowering, x: TensorValue, dim: Any, keepdim: bool = False) -> Lazy:
    dims = _dims(x, dim)
    out = ctx.out_dtype()
    mx = reduce(ctx, x, dims, True, "max", x.dtype)
    # exp(x - max) <= 1 in the input's precision (float32: the vectorised exp, as eager's
    # own kernel; float64 operands would call libm's exp per element, ~5x slower), summed
    # in float64
    exp_dtype = "float64" if x.dtype == "float64" else "float32"

    def shifted(index: list[str]) -> Expr:
        m = cast(load_broadcast(mx, x.shape, index), exp_dtype)
        safe = Op("where", (Op("isinf", (m,), "bool"), Const(0.0, exp_dtype), m), exp_dtype)
        return Op("exp", (Op("sub", (cast(x.load(index), exp_dtype), safe), exp_dtype),),
                  exp_dtype)
    total = reduce(ctx, x, dims, keepdim, "sum", "float64", body=shifted)
    mk = mx if keepdim else _same_buffer_as(mx, total.shape)

    def fn(index: list[str]) -> Expr:
        m = cast(mk.load(index), "float64")
        safe = Op("where", (Op("isinf", (m,), "bool"), Const(0.0, "float64"), m), "float64")
        return cast(Op("add", (Op("log", (total.load(index),), "float64"), safe), "float64"), out)
    return Lazy(total.shape, out, fn, 3)


@register(torch.ops.prims.var.default)
def _prims_var(ctx: GraphLowering, x: TensorValue, dims: Any, correction: float = 1.0,
               *, output_dtype: Any = None) -> Realized:
    return _var(ctx, x, _dims(x, dims), float(correction), False, ctx.out_dtype())[0]


@register(torch.ops.prims.sum.default)
def _prims_sum(ctx: GraphLowering, x: TensorValue, dims: Any, *, output_dtype: Any = None):
    return reduce(ctx, x, _dims(x, dims), False, "sum", ctx.out_dtype())


@register(torch.ops.prims.amax.default, torch.ops.prims.amin.default)
def _prims_amax(ctx: GraphLowering, x: TensorValue, dims: Any) -> Realized:
    op = "max" if ctx.current.target is torch.ops.prims.amax.default else "min"
    return reduce(ctx, x, _dims(x, dims), False, op, ctx.out_dtype())

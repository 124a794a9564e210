"""Pairwise distances and multilinear products as fused reductions: ``cdist`` reduces
``|x1 - x2|**p`` over the feature dim in one kernel, ``_trilinear`` (``F.bilinear``)
reduces a broadcast product of its three operands."""
from __future__ import annotations

import math
from typing import Any

import torch

from simaccel.codegen.dtypes import compute_dtype
from simaccel.codegen.graph import GraphLowering, Unsupported
from simaccel.codegen.ir import Const, Expr, Op
from simaccel.codegen.lower_reduce import reduce
from simaccel.codegen.operands import as_dtype
from simaccel.codegen.registry import register
from simaccel.codegen.values import Lazy, TensorValue, cast, load_broadcast, unsqueeze

aten = torch.ops.aten


@register(aten._cdist_forward.default)
def _cdist(ctx: GraphLowering, x1: TensorValue, x2: TensorValue, p: float,
           compute_mode: Any = None) -> TensorValue:
    """``dist[..., i, j] = (sum_k |x1[..., i, k] - x2[..., j, k]|**p)**(1/p)``, summed in
    float64 (p = 0 counts the differing features, p = inf takes their largest)."""
    dtype = ctx.out_dtype()
    shape = ctx.out_shape()  # (*batch, P, R)
    full = shape + (x1.shape[-1],)
    nb = len(shape) - 2

    def diff(index: list[str]) -> Expr:
        a = load_broadcast(x1, shape[:-1] + (x1.shape[-1],), index[:nb + 1] + index[-1:])
        b = load_broadcast(x2, shape[:-2] + x2.shape[-2:], index[:nb] + index[nb + 1:])
        d = Op("sub", (cast(a, "float64"), cast(b, "float64")), "float64")
        return Op("abs", (d,), "float64")
    if p == 0:
        term = lambda i: cast(Op("ne", (diff(i), Const(0.0, "float64")), "bool"), "float64")
        op, finalize = "sum", ""
    elif math.isinf(p):
        term, op, finalize = diff, "max", ""
    else:
        term = diff if p == 1 else (lambda i: Op("pow", (diff(i), Const(float(p), "float64")),
                                                  "float64"))
        op = "sum"
        finalize = "" if p == 1 else ("np.sqrt({acc})" if p == 2 else
                                      f"{{acc}} ** np.float64({1.0 / p!r})")
    values = Lazy(full, "float64", term, 4)
    out = reduce(ctx, values, [len(full) - 1], False, op, compute_dtype(dtype),
                 finalize=finalize)
    return as_dtype(out, dtype)


@register(aten._trilinear.default)
def _trilinear(ctx: GraphLowering, i1: TensorValue, i2: TensorValue, i3: TensorValue,
               expand1: list[int], expand2: list[int], expand3: list[int],
               sumdim: list[int], unroll_dim: int = 1) -> TensorValue:
    """``(i1.unsqueeze(expand1) * i2.unsqueeze(expand2) * i3.unsqueeze(expand3))``
    summed over ``sumdim`` (the dims each operand gains, as ATen inserts them)."""
    dtype = ctx.out_dtype()
    work = compute_dtype(dtype)
    operands = []
    for value, dims in ((i1, expand1), (i2, expand2), (i3, expand3)):
        for d in sorted(dims):
            value = unsqueeze(value, d)
        operands.append(value)
    full = tuple(torch.broadcast_shapes(*[v.shape for v in operands]))
    if len(full) != operands[0].ndim:
        raise Unsupported("_trilinear operands of different ranks")

    def product(index: list[str]) -> Expr:
        loads = [cast(load_broadcast(v, full, index), work) for v in operands]
        return Op("mul", (Op("mul", (loads[0], loads[1]), work), loads[2]), work)
    values = Lazy(full, work, product, 3)
    if not sumdim:
        return as_dtype(values, dtype)
    return as_dtype(reduce(ctx, values, sorted(sumdim), False, "sum", work), dtype)


@register(aten._cdist_backward.default)
def _cdist_backward(ctx: GraphLowering, grad: TensorValue, x1: TensorValue, x2: TensorValue,
                    p: float, dist: TensorValue) -> TensorValue:
    """The gradient w.r.t. ``x1``: ``sum_j grad[i, j] * d dist[i, j] / d x1[i, k]`` (0
    where the distance is 0), as ATen's ``_cdist_backward``."""
    dtype = ctx.out_dtype()
    shape = grad.shape  # (*batch, P, R)
    nb = len(shape) - 2
    full = shape[:-1] + (x1.shape[-1],) + shape[-1:]  # (*batch, P, M, R): reduce over R

    def term(index: list[str]) -> Expr:
        pair = index[:nb + 1] + index[-1:]
        a = cast(load_broadcast(x1, shape[:-1] + (x1.shape[-1],), index[:-1]), "float64")
        b = cast(load_broadcast(x2, shape[:-2] + x2.shape[-2:], index[:nb] + index[-1:]
                                + index[nb + 1:nb + 2]), "float64")
        g = cast(load_broadcast(grad, shape, pair), "float64")
        d = cast(load_broadcast(dist, shape, pair), "float64")
        diff = Op("sub", (a, b), "float64")
        return Op("where", (Op("eq", (d, Const(0.0, "float64")), "bool"), Const(0.0, "float64"),
                            Op("mul", (g, _cdist_slope(diff, d, p)), "float64")), "float64")
    values = Lazy(full, "float64", term, 8)
    out = reduce(ctx, values, [len(full) - 1], False, "sum", compute_dtype(dtype))
    return as_dtype(out, dtype)


def _cdist_slope(diff: Expr, dist: Expr, p: float) -> Expr:
    """d dist / d x1 for one feature (float64)."""
    f64 = "float64"
    if p == 0:
        return Const(0.0, f64)
    sign = Op("sign", (diff,), f64)
    if p == 1:
        return sign
    if math.isinf(p):
        at_max = Op("eq", (Op("abs", (diff,), f64), dist), "bool")
        return Op("where", (at_max, sign, Const(0.0, f64)), f64)
    if p == 2:
        return Op("truediv", (diff, dist), f64)
    power = Op("pow", (Op("abs", (diff,), f64), Const(p - 1.0, f64)), f64)
    return Op("truediv", (Op("mul", (sign, power), f64),
                          Op("pow", (dist, Const(p - 1.0, f64)), f64)), f64)

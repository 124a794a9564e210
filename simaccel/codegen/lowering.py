"""Pointwise and scalar lowerings: one entry per ATen op, producing device values.

A lowering is ``fn(ctx, *args, **kwargs)`` where tensor arguments arrive as
:class:`~simaccel.codegen.values.TensorValue` and ``ctx`` is the
:class:`~simaccel.codegen.graph.GraphLowering` (output shape/dtype of the node being
lowered, buffer allocation, kernel emission). Pointwise lowerings return
:class:`Lazy` values, so chains of them fuse into one kernel.

Adding an op: register a lowering here (or in lower_views / lower_index / lower_reduce /
lower_extern) with :func:`simaccel.codegen.registry.register`, add a line to the op
test table.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch

from simaccel.codegen.dtypes import is_float, torch_to_np_dtype
from simaccel.codegen.graph import GraphLowering, Unsupported
from simaccel.codegen.ir import Const, Expr, IndexValue, Op, size_value
from simaccel.codegen.registry import register
from simaccel.codegen.sizes import float_source, is_symbolic, source
from simaccel.codegen.values import (Lazy, Realized, TensorValue, cast, load_broadcast)

aten = torch.ops.aten
prims = torch.ops.prims

# --------------------------------------------------------------------------- helpers


def operand_expr(value: Any, out_shape: tuple[int, ...], index: list[str], dtype: str) -> Expr:
    """Load ``value`` (tensor or Python scalar) broadcast to ``out_shape``, as ``dtype``."""
    if isinstance(value, TensorValue):
        return cast(load_broadcast(value, out_shape, index), dtype)
    if is_symbolic(value):  # a size or lifted int: the kernel takes it as an argument
        return cast(size_value(value), dtype)
    if isinstance(value, torch.SymFloat):
        # a float of sizes or lifted ints (``1.0 / p``, attention's 1/sqrt(head_dim)):
        # evaluated in the kernel from its size arguments where it can be; else
        # specialized, with the shape env's guard (listed in the report)
        text = float_source(value)
        if text is not None:
            return cast(IndexValue(text, "float64"), dtype)
        return Const(float(value), dtype if is_float(dtype) else "float64")
    if isinstance(value, bool) or dtype == "bool":
        return Const(bool(value), "bool") if dtype == "bool" else Const(int(value), dtype)
    if isinstance(value, (int, float)):
        return Const(value, dtype)
    raise Unsupported(f"operand of type {type(value).__name__}")


def promoted_dtype(ctx: GraphLowering) -> str:
    """The dtype PyTorch computes a node's binary/comparison op in (type promotion)."""
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a
            for a in ctx.current.args]
    vals = [_python_scalar(v) for v in vals]
    vals = [v for v in vals if isinstance(v, (torch.Tensor, int, float, bool))]
    if not vals:
        return ctx.out_dtype()
    dtype = vals[0].dtype if isinstance(vals[0], torch.Tensor) else torch.tensor(vals[0]).dtype
    if len(vals) > 1:
        dtype = torch.result_type(vals[0], vals[1])
    name = torch_to_np_dtype(dtype)
    if name is None:
        raise Unsupported(f"dtype {dtype} is not a device dtype")
    return name


def _python_scalar(value: Any) -> Any:
    """A SymInt/SymFloat stands for a Python number in type promotion."""
    if isinstance(value, torch.SymBool):
        return True
    if isinstance(value, torch.SymInt):
        return 1
    if isinstance(value, torch.SymFloat):
        return 1.0
    return value


def elementwise(ctx: GraphLowering, op: str, operands: list[Any], compute: str | None = None,
                op_dtype: str | None = None) -> Lazy:
    """A pointwise op on broadcast operands: compute in ``compute``, cast to the output."""
    shape, out = ctx.out_shape(), ctx.out_dtype()
    compute = compute or out
    result = op_dtype or compute
    ops = 1 + sum(getattr(o, "ops", 0) for o in operands)

    def fn(index: list[str]) -> Expr:
        args = tuple(operand_expr(o, shape, index, compute) for o in operands)
        return cast(Op(op, args, result), out)
    return Lazy(shape, out, fn, ops)


def lazy_const(ctx: GraphLowering, value: Any) -> Lazy:
    dtype = ctx.out_dtype()
    if is_symbolic(value):
        return Lazy(ctx.out_shape(), dtype,
                    lambda index: operand_expr(value, (), [], dtype), 1)
    if dtype == "bool":
        value = bool(value)
    elif not is_float(dtype):
        value = int(value)
    return Lazy(ctx.out_shape(), dtype, lambda index: Const(value, dtype), 0)


# --------------------------------------------------------------------------- unary

UNARY = {
    aten.neg: "neg", aten.abs: "abs", aten.exp: "exp", aten.log: "log", aten.log1p: "log1p",
    aten.expm1: "expm1", aten.sqrt: "sqrt", aten.rsqrt: "rsqrt", aten.sin: "sin",
    aten.cos: "cos", aten.tan: "tan", aten.tanh: "tanh", aten.sigmoid: "sigmoid",
    aten.erf: "erf", aten.reciprocal: "reciprocal", aten.sign: "sign", aten.floor: "floor",
    aten.ceil: "ceil", aten.trunc: "trunc", aten.log2: "log2", aten.log10: "log10",
    aten.exp2: "exp2", aten.asin: "asin", aten.acos: "acos", aten.atan: "atan",
    aten.sinh: "sinh", aten.cosh: "cosh", aten.bitwise_not: "bitwise_not",
}
UNARY_BOOL = {aten.isnan: "isnan", aten.isinf: "isinf", aten.logical_not: "logical_not",
              aten.isfinite: "isfinite"}


def _unary(op: str) -> Callable:
    def lower(ctx: GraphLowering, x: TensorValue) -> Lazy:
        if op in ("floor", "ceil", "trunc", "round") and not is_float(x.dtype):
            return elementwise(ctx, "identity", [x])
        return elementwise(ctx, op, [x])
    return lower


def _unary_bool(op: str) -> Callable:
    def lower(ctx: GraphLowering, x: TensorValue) -> Lazy:
        return elementwise(ctx, op, [x], compute=x.dtype, op_dtype="bool")
    return lower


for _op, _name in UNARY.items():
    register(_op.default)(_unary(_name))
for _op, _name in UNARY_BOOL.items():
    register(_op.default)(_unary_bool(_name))


@register(aten.round.default)
def _round(ctx: GraphLowering, x: TensorValue) -> Lazy:
    return elementwise(ctx, "round" if is_float(x.dtype) else "identity", [x])


@register(aten.round.decimals)
def _round_decimals(ctx: GraphLowering, x: TensorValue, *, decimals: int = 0) -> Lazy:
    """As torch's CPU kernel: round(x * 10**d) / 10**d, or round(x / 10**-d) * 10**-d."""
    if not is_float(x.dtype):
        return elementwise(ctx, "identity", [x])
    scale = float(10 ** abs(decimals))
    first, last = ("truediv", "mul") if decimals < 0 else ("mul", "truediv")
    scaled = elementwise(ctx, first, [x, scale])
    return elementwise(ctx, last, [elementwise(ctx, "round", [scaled]), scale])


@register(aten.relu.default)
def _relu(ctx: GraphLowering, x: TensorValue) -> Lazy:
    return elementwise(ctx, "maximum", [x, 0])


@register(aten.silu.default)
def _silu(ctx: GraphLowering, x: TensorValue) -> Lazy:
    sig = elementwise(ctx, "sigmoid", [x])
    return elementwise(ctx, "mul", [x, sig])


@register(aten.gelu.default)
def _gelu(ctx: GraphLowering, x: TensorValue, approximate: str = "none") -> Lazy:
    d = ctx.out_dtype()

    def fn(index: list[str]) -> Expr:
        v = cast(x.load(index), d)
        half = Op("mul", (v, Const(0.5, d)), d)
        if approximate == "tanh":
            cube = Op("mul", (Op("mul", (v, v), d), v), d)
            inner = Op("add", (v, Op("mul", (cube, Const(0.044715, d)), d)), d)
            t = Op("tanh", (Op("mul", (inner, Const(math.sqrt(2 / math.pi), d)), d),), d)
        else:
            t = Op("erf", (Op("mul", (v, Const(1 / math.sqrt(2), d)), d),), d)
        return Op("mul", (half, Op("add", (t, Const(1.0, d)), d)), d)
    return Lazy(ctx.out_shape(), d, fn, getattr(x, "ops", 0) + 8)


# --------------------------------------------------------------------------- binary

BINARY = {
    aten.add: "add", aten.sub: "sub", aten.mul: "mul", aten.maximum: "maximum",
    aten.minimum: "minimum", aten.fmax: "fmax", aten.fmin: "fmin", aten.atan2: "atan2",
    aten.bitwise_and: "bitwise_and", aten.bitwise_or: "bitwise_or",
    aten.bitwise_xor: "bitwise_xor", aten.remainder: "remainder", aten.fmod: "fmod",
    aten.pow: "pow", aten.floor_divide: "floordiv",
    aten.bitwise_left_shift: "lshift", aten.bitwise_right_shift: "rshift",
    aten.__lshift__: "lshift", aten.__rshift__: "rshift",  # Python's << and >> on tensors
}
COMPARE = {aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le", aten.gt: "gt",
           aten.ge: "ge", aten.logical_and: "logical_and", aten.logical_or: "logical_or",
           aten.logical_xor: "logical_xor"}


def _binary(op: str) -> Callable:
    def lower(ctx: GraphLowering, a: Any, b: Any, alpha: Any = None) -> Lazy:
        if alpha is not None and alpha != 1:
            b = elementwise(ctx, "mul", [b, alpha])
        if op == "pow" and isinstance(b, (int, float)) and isinstance(a, TensorValue):
            special = _pow_scalar(ctx, a, b)
            if special is not None:
                return special
        return elementwise(ctx, op, [a, b])
    return lower


def _pow_scalar(ctx: GraphLowering, a: TensorValue, exponent: float) -> Lazy | None:
    """The exponents torch's CPU pow replaces by other ops (PowKernel.cpp). Matching
    them matters at the edges: pow(-inf, 0.5) is sqrt's NaN, not C pow's inf."""
    if exponent == 2:
        return elementwise(ctx, "mul", [a, a])
    if not is_float(ctx.out_dtype()):
        return None
    if exponent == 3:
        return elementwise(ctx, "mul", [elementwise(ctx, "mul", [a, a]), a])
    if exponent == -2:
        return elementwise(ctx, "reciprocal", [elementwise(ctx, "mul", [a, a])])
    unary = {0.5: "sqrt", -0.5: "rsqrt", -1: "reciprocal"}.get(exponent)
    return elementwise(ctx, unary, [a]) if unary else None


def _compare(op: str) -> Callable:
    def lower(ctx: GraphLowering, a: Any, b: Any) -> Lazy:
        return elementwise(ctx, op, [a, b], compute=promoted_dtype(ctx), op_dtype="bool")
    return lower


for _op, _name in BINARY.items():
    register(_op)(_binary(_name))
for _op, _name in COMPARE.items():
    register(_op)(_compare(_name))


@register(aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor)
def _div(ctx: GraphLowering, a: Any, b: Any) -> Lazy:
    return elementwise(ctx, "truediv", [a, b])


@register(prims.div.default)
def _prims_div(ctx: GraphLowering, a: Any, b: Any) -> Lazy:
    """prims.div: true division on floats, truncation on integers."""
    return elementwise(ctx, "truediv" if is_float(ctx.out_dtype()) else "truncdiv", [a, b])


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx: GraphLowering, a: Any, b: Any, rounding_mode: str | None = None) -> Lazy:
    op = {"floor": "floordiv", "trunc": "truncdiv", None: "truediv"}[rounding_mode]
    return elementwise(ctx, op, [a, b])


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx: GraphLowering, cond: Any, a: Any, b: Any) -> Lazy:
    shape, out = ctx.out_shape(), ctx.out_dtype()

    def fn(index: list[str]) -> Expr:
        c = operand_expr(cond, shape, index, "bool")
        return Op("where", (c, operand_expr(a, shape, index, out),
                            operand_expr(b, shape, index, out)), out)
    return Lazy(shape, out, fn, 1 + sum(getattr(v, "ops", 0) for v in (cond, a, b)))


@register(aten.clamp.default, aten.clamp.Tensor)
def _clamp(ctx: GraphLowering, x: TensorValue, min: Any = None, max: Any = None) -> Lazy:
    result: Any = x
    if min is not None:
        result = elementwise(ctx, "maximum", [result, min])
    if max is not None:
        result = elementwise(ctx, "minimum", [result, max])
    return result if isinstance(result, Lazy) else elementwise(ctx, "identity", [x])


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(ctx: GraphLowering, x: TensorValue, m: Any) -> Lazy:
    return elementwise(ctx, "maximum", [x, m])


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(ctx: GraphLowering, x: TensorValue, m: Any) -> Lazy:
    return elementwise(ctx, "minimum", [x, m])


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(ctx: GraphLowering, x: TensorValue, mask: TensorValue, value: Any) -> Lazy:
    return _where(ctx, mask, value, x)


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(ctx: GraphLowering, a: TensorValue, b: TensorValue, w: Any) -> Lazy:
    diff = elementwise(ctx, "sub", [b, a])
    return elementwise(ctx, "add", [a, elementwise(ctx, "mul", [w, diff])])


# --------------------------------------------------------------------------- conversions


@register(aten._to_copy.default, prims.convert_element_type.default, aten.clone.default,
          aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
          aten.contiguous.default)
def _copy(ctx: GraphLowering, x: TensorValue, *args: Any, **kwargs: Any) -> Any:
    if isinstance(x, Realized) and ctx.out_dtype() == x.dtype and ctx.current.target in (
            aten.alias.default, aten.detach.default):
        return x
    if kwargs.get("device") not in (None, torch.device("cpu")) or kwargs.get("layout") not in (
            None, torch.strided):
        raise Unsupported("copy to another device or layout")
    return elementwise(ctx, "identity", [x])


@register(aten.copy.default)
def _copy_into(ctx: GraphLowering, dst: TensorValue, src: Any, non_blocking: bool = False) -> Lazy:
    return elementwise(ctx, "identity", [src])


# --------------------------------------------------------------------------- constructors


@register(aten.full.default, aten.full_like.default, aten.scalar_tensor.default,
          aten.zeros.default, aten.ones.default, aten.zeros_like.default,
          aten.ones_like.default, aten.empty.memory_format, aten.empty_like.default,
          aten.new_zeros.default, aten.new_ones.default, aten.new_full.default,
          aten.new_empty.default, aten.empty_strided.default)
def _full(ctx: GraphLowering, *args: Any, **kwargs: Any) -> Lazy:
    target = ctx.current.target
    fill = _fill_value(target, args)
    if isinstance(fill, TensorValue):  # a lifted scalar: read from the constant bank
        return elementwise(ctx, "identity", [fill])
    return lazy_const(ctx, fill)


def _fill_value(target: Any, args: tuple) -> Any:
    if target in (aten.full.default, aten.full_like.default):
        return args[1]
    if target is aten.new_full.default:
        return args[2]
    if target is aten.scalar_tensor.default:
        return args[0]
    if target in (aten.ones.default, aten.ones_like.default, aten.new_ones.default):
        return 1
    return 0  # zeros and empty (empty's contents are undefined; zeros is a valid choice)


@register(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(ctx: GraphLowering, *args: Any, **kwargs: Any) -> Lazy:
    if ctx.current.target is aten.arange.default:
        start, step = 0, 1
    else:
        start = args[0]
        step = args[2] if len(args) > 2 else kwargs.get("step", 1)
    return _iota(ctx, start, step)


@register(prims.iota.default)
def _prims_iota(ctx: GraphLowering, length: int, *, start: int, step: int, **kwargs: Any) -> Lazy:
    return _iota(ctx, start, step)


def _iota(ctx: GraphLowering, start: Any, step: Any) -> Lazy:
    dtype = ctx.out_dtype()
    compute = "float64" if is_float(dtype) else "int64"

    def fn(index: list[str]) -> Expr:
        i = IndexValue(index[0], compute)
        value = Op("add", (operand_expr(start, (), [], compute),
                           Op("mul", (i, operand_expr(step, (), [], compute)), compute)),
                   compute)
        return cast(value, dtype)
    return Lazy(ctx.out_shape(), dtype, fn, 2)


@register(aten.tril.default, aten.triu.default)
def _tril(ctx: GraphLowering, x: TensorValue, diagonal: int = 0) -> Lazy:
    lower = ctx.current.target is aten.tril.default
    dtype = x.dtype

    def fn(index: list[str]) -> Expr:
        row, col = index[-2], index[-1]
        diag = source(diagonal)
        keep = f"({col} - {row} <= {diag})" if lower else f"({col} - {row} >= {diag})"
        return Op("where", (IndexValue(keep, "bool"), x.load(index), Const(0, dtype)
                            if dtype != "bool" else Const(False, "bool")), dtype)
    return Lazy(x.shape, dtype, fn, getattr(x, "ops", 0) + 1)




# --------------------------------------------------------------------------- symbolic scalars
# Lifted int scalars arrive as SymInt placeholders; arithmetic on them appears in the graph
# as Python operator calls. On the device they are 0-d values read from the constant bank.

_SCALAR_OPS = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul",
    operator.truediv: "truediv", operator.floordiv: "floordiv", operator.mod: "remainder",
    operator.pow: "pow", operator.neg: "neg", operator.eq: "eq", operator.ne: "ne",
    operator.lt: "lt", operator.le: "le", operator.gt: "gt", operator.ge: "ge",
    torch.sym_float: "cast", torch.sym_int: "cast", torch.sym_max: "maximum",
    torch.sym_min: "minimum",
}


def _scalar_op(op: Callable, name: str) -> Callable:
    def lower(ctx: GraphLowering, *args: Any) -> Any:
        if not any(isinstance(a, TensorValue) for a in args):
            return op(*args)  # constant folding of plain Python numbers
        dtype = _scalar_result_dtype(ctx)
        compute = "bool" if name in ("eq", "ne", "lt", "le", "gt", "ge") else dtype
        operands = list(args)
        if compute == "bool":
            compute = "float64" if any(_is_float_operand(a) for a in args) else "int64"

        def fn(index: list[str]) -> Expr:
            exprs = tuple(operand_expr(a, (), [], compute) for a in operands)
            return cast(Op(name, exprs, "bool" if dtype == "bool" else compute), dtype)
        return Lazy((), dtype, fn, 1)
    return lower


def _is_float_operand(value: Any) -> bool:
    return isinstance(value, float) or (isinstance(value, TensorValue) and is_float(value.dtype))


def _scalar_result_dtype(ctx: GraphLowering) -> str:
    val = ctx.current.meta.get("val")
    if isinstance(val, (bool, torch.SymBool)):
        return "bool"
    if isinstance(val, (int, torch.SymInt)):
        return "int64"
    return "float64"


for _fn, _name in _SCALAR_OPS.items():
    register(_fn)(_scalar_op(_fn, _name))


"""Symbolic scalar arguments: lifted floats and ints that reach an op as a Python number.

A lifted float arrives as a 0-d float64 graph input; where AOTAutograd's tensorify pass
cannot turn its uses into tensor ops (``add(x, y, alpha=-lr)``, ``clamp(x, min=lo)``,
``pow(x, p)``, ``full(size, v)``, fill values, ``where`` scalars...), the ATen graph reads
it with ``aten._local_scalar_dense`` (``.item()``) and passes the symbolic number on
(``simaccel.guards.dynamo.tensorify`` keeps it so). A lifted int is a SymInt input. On
the device both are 0-d values read from the constant bank: every lowering takes a
:class:`~simaccel.codegen.values.TensorValue` where eager takes a number.

Host fallbacks take numbers where the op's schema says so (:func:`number_arguments`):
the call's value is read from its (host copy of the) bank slot, never passed as a
0-d tensor.

Also here: ``prims.fma`` (torch.optim's ``addcmul_`` in Dynamo's graphs: Adam, AdamW),
one rounding as on hardware with a fused multiply-add.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from simaccel.codegen.dtypes import is_float
from simaccel.codegen.graph import GraphLowering, Unsupported
from simaccel.codegen.ir import Const, Expr, Op
from simaccel.codegen.lowering import elementwise, operand_expr
from simaccel.codegen.registry import LOWERINGS, register
from simaccel.codegen.values import Lazy, TensorValue, cast

aten = torch.ops.aten
prims = torch.ops.prims


@register(aten._local_scalar_dense.default)
def _item(ctx: GraphLowering, x: Any) -> Lazy:
    """``.item()`` of a one-element value: the Python number as a 0-d value (float64 for
    floats, int64 for integers, as Python holds them)."""
    if not isinstance(x, TensorValue) or x.numel != 1:
        raise Unsupported("item() of a value that is not one element")
    dtype = "float64" if is_float(x.dtype) else "bool" if x.dtype == "bool" else "int64"
    index = ["0"] * x.ndim
    return Lazy((), dtype, lambda _: cast(x.load(index), dtype), getattr(x, "ops", 0))


@register(prims.fma.default)
def _fma(ctx: GraphLowering, a: Any, b: Any, c: Any) -> Lazy:
    """``a * b + c`` rounded once (``llvm.fma``)."""
    shape, out = ctx.out_shape(), ctx.out_dtype()
    if not is_float(out):
        return elementwise(ctx, "add", [elementwise(ctx, "mul", [a, b]), c])
    ops = 1 + sum(getattr(v, "ops", 0) for v in (a, b, c))

    def fn(index: list[str]) -> Expr:
        args = tuple(operand_expr(v, shape, index, out) for v in (a, b, c))
        return Op("fma", args, out)
    return Lazy(shape, out, fn, ops)


_POW_TENSOR_SCALAR = LOWERINGS[aten.pow.Tensor_Scalar]

#: exponents torch's CPU pow computes by other ops (PowKernel.cpp), and how
_POW_SPECIAL: tuple[tuple[float, Callable[[Expr, str], Expr]], ...] = (
    (2.0, lambda x, d: Op("mul", (x, x), d)),
    (3.0, lambda x, d: Op("mul", (Op("mul", (x, x), d), x), d)),
    (-2.0, lambda x, d: Op("reciprocal", (Op("mul", (x, x), d),), d)),
    (0.5, lambda x, d: Op("sqrt", (x,), d)),
    (-0.5, lambda x, d: Op("rsqrt", (x,), d)),
    (-1.0, lambda x, d: Op("reciprocal", (x,), d)),
)


@register(aten.pow.Tensor_Scalar)
def _pow_symbolic(ctx: GraphLowering, x: Any, exponent: Any) -> Any:
    """``x ** p`` for a lifted ``p``: torch's special exponents are chosen per call, on the
    value read from the constant bank (a constant ``p`` keeps the compile-time choice)."""
    out = ctx.out_dtype()
    if not (isinstance(exponent, TensorValue) and exponent.ndim == 0 and is_float(out)):
        return _POW_TENSOR_SCALAR(ctx, x, exponent)
    shape = ctx.out_shape()

    def fn(index: list[str]) -> Expr:
        base = operand_expr(x, shape, index, out)
        p = exponent.load([])
        value: Expr = Op("pow", (base, cast(p, out)), out)
        for special, compute in reversed(_POW_SPECIAL):
            hit = Op("eq", (cast(p, "float64"), Const(special, "float64")), "bool")
            value = Op("where", (hit, compute(base, out), value), out)
        return value
    return Lazy(shape, out, fn, 8 + getattr(x, "ops", 0))


# --------------------------------------------------------------------------- host fallbacks

#: schema type names of numbers (``Scalar`` prints as ``number``; ``SymInt`` as ``int``)
_NUMBER_TYPES = frozenset({"number", "float", "int", "bool", "SymInt", "SymFloat"})


@dataclass(frozen=True)
class NumberArguments:
    """The arguments of an op its schema types as numbers (or lists of numbers): by
    position and by keyword name."""

    positions: frozenset[int] = frozenset()
    names: frozenset[str] = frozenset()

    def apply(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """``args``/``kwargs`` with every 0-d tensor at a number argument made a Python
        number (``item()``: exact for the bank's float64 and int slots)."""
        if not self.positions and not self.names:
            return args, kwargs
        args = tuple(_number(a) if k in self.positions else a for k, a in enumerate(args))
        kwargs = {k: _number(v) if k in self.names else v for k, v in kwargs.items()}
        return args, kwargs


def _number(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(_number(v) for v in value)
    return value


def number_arguments(target: Any) -> NumberArguments:
    """Which arguments of ``target`` take numbers (from its ATen schema; none for a
    target without one)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return NumberArguments()
    positions, names = set(), set()
    for k, argument in enumerate(schema.arguments):
        text = str(argument.type)
        for wrapper in ("Optional[", "List["):
            if text.startswith(wrapper):
                text = text[len(wrapper):-1]
        if text in _NUMBER_TYPES:
            names.add(argument.name)
            if not argument.kwarg_only:
                positions.add(k)
    return NumberArguments(frozenset(positions), frozenset(names))

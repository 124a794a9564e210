"""Special-function lowerings: pointwise ops (they fuse like any other) whose scalar
operation is a float64 helper (:mod:`.special_ops`), rounded once to the op's dtype."""
from __future__ import annotations

from typing import Any, Callable

import torch

from simaccel.codegen.graph import GraphLowering
from simaccel.codegen.ir import Expr, Op
from simaccel.codegen.lowering import elementwise, operand_expr
from simaccel.codegen.registry import register
from simaccel.codegen.values import Lazy, TensorValue, cast

aten = torch.ops.aten

#: aten op -> scalar op of one tensor argument
UNARY = {
    aten.lgamma.default: "lgamma", aten.digamma.default: "digamma",
    aten.special_psi.default: "digamma", aten.erfc.default: "erfc",
    aten.erfinv.default: "erfinv", aten.special_erfcx.default: "erfcx",
    aten.special_ndtri.default: "ndtri", aten.special_log_ndtr.default: "log_ndtr",
    aten.i0.default: "i0", aten.special_i0e.default: "i0e", aten.special_i1.default: "i1",
    aten.special_i1e.default: "i1e", aten.special_bessel_j0.default: "bessel_j0",
    aten.special_bessel_j1.default: "bessel_j1", aten.special_bessel_y0.default: "bessel_y0",
    aten.special_bessel_y1.default: "bessel_y1",
    aten.special_spherical_bessel_j0.default: "spherical_bessel_j0",
    aten.special_airy_ai.default: "airy_ai",
    aten.special_modified_bessel_i0.default: "i0", aten.special_modified_bessel_i1.default: "i1",
    aten.special_modified_bessel_k0.default: "modified_bessel_k0",
    aten.special_modified_bessel_k1.default: "modified_bessel_k1",
    aten.special_scaled_modified_bessel_k0.default: "scaled_modified_bessel_k0",
    aten.special_scaled_modified_bessel_k1.default: "scaled_modified_bessel_k1",
    aten.acosh.default: "acosh", aten.asinh.default: "asinh", aten.atanh.default: "atanh",
}
#: aten op packet (Tensor/Scalar overloads) -> scalar op of two arguments
BINARY = {
    aten.special_zeta: "zeta", aten.copysign: "copysign", aten.hypot: "hypot",
    aten.nextafter: "nextafter",
    aten.special_chebyshev_polynomial_t: "chebyshev_polynomial_t",
    aten.special_chebyshev_polynomial_u: "chebyshev_polynomial_u",
    aten.special_chebyshev_polynomial_v: "chebyshev_polynomial_v",
    aten.special_chebyshev_polynomial_w: "chebyshev_polynomial_w",
    aten.special_shifted_chebyshev_polynomial_t: "shifted_chebyshev_polynomial_t",
    aten.special_shifted_chebyshev_polynomial_u: "shifted_chebyshev_polynomial_u",
    aten.special_shifted_chebyshev_polynomial_v: "shifted_chebyshev_polynomial_v",
    aten.special_shifted_chebyshev_polynomial_w: "shifted_chebyshev_polynomial_w",
    aten.special_hermite_polynomial_h: "hermite_polynomial_h",
    aten.special_hermite_polynomial_he: "hermite_polynomial_he",
    aten.special_laguerre_polynomial_l: "laguerre_polynomial_l",
    aten.special_legendre_polynomial_p: "legendre_polynomial_p",
}


def _unary(op: str) -> Callable:
    def lower(ctx: GraphLowering, x: TensorValue) -> Lazy:
        return elementwise(ctx, op, [x])
    return lower


def _binary(op: str) -> Callable:
    def lower(ctx: GraphLowering, a: Any, b: Any) -> Lazy:
        return elementwise(ctx, op, [a, b])
    return lower


for _op, _name in UNARY.items():
    register(_op)(_unary(_name))
for _packet, _name in BINARY.items():
    register(_packet)(_binary(_name))


@register(aten.polygamma.default)
def _polygamma(ctx: GraphLowering, n: int, x: TensorValue) -> Lazy:
    shape, dtype = ctx.out_shape(), ctx.out_dtype()

    def fn(index: list[str]) -> Expr:
        return Op("polygamma", (operand_expr(n, shape, index, "int64"),
                                operand_expr(x, shape, index, dtype)), dtype)
    return Lazy(shape, dtype, fn, getattr(x, "ops", 0) + 1)


@register(aten.signbit.default)
def _signbit(ctx: GraphLowering, x: TensorValue) -> Lazy:
    return elementwise(ctx, "signbit", [x], compute=x.dtype, op_dtype="bool")


@register(aten.frexp.Tensor)
def _frexp(ctx: GraphLowering, x: TensorValue) -> tuple[Lazy, Lazy]:
    """(mantissa in [0.5, 1), int32 exponent) with ``x = mantissa * 2**exponent``."""
    mantissa = elementwise(ctx, "frexp_mantissa", [x])

    def exponent(index: list[str]) -> Expr:
        return cast(Op("frexp_exponent", (x.load(index),), "int64"), "int32")
    return mantissa, Lazy(x.shape, "int32", exponent, getattr(x, "ops", 0) + 1)

"""The scalar operations of special functions: their kernel source (numba-free, so
emitting a kernel imports no numba). Each evaluates in float64 through the kernel_lib
helpers (:mod:`.special_lib`, :mod:`.special_bessel`, :mod:`.special_modified`,
:mod:`.special_poly`); the emitter rounds the result to the op's dtype."""
from __future__ import annotations

from typing import Callable

Renderer = Callable[[list[str], list[str], str], str]

#: op name -> helper, called on one float64 argument
UNARY = {
    "lgamma": "lib.special.lgamma", "digamma": "lib.special.digamma",
    "erfc": "lib.special.erfc", "erfinv": "lib.special.erfinv",
    "erfcx": "lib.special.erfcx", "ndtri": "lib.special.ndtri",
    "log_ndtr": "lib.special.log_ndtr", "i0e": "lib.special.i0e", "i1e": "lib.special.i1e",
    "i0": "lib.special_modified.modified_bessel_i0",
    "i1": "lib.special_modified.modified_bessel_i1",
    "bessel_j0": "lib.special_bessel.bessel_j0", "bessel_j1": "lib.special_bessel.bessel_j1",
    "bessel_y0": "lib.special_bessel.bessel_y0", "bessel_y1": "lib.special_bessel.bessel_y1",
    "spherical_bessel_j0": "lib.special_bessel.spherical_bessel_j0",
    "airy_ai": "lib.special_bessel.airy_ai",
    "modified_bessel_k0": "lib.special_modified.modified_bessel_k0",
    "modified_bessel_k1": "lib.special_modified.modified_bessel_k1",
    "scaled_modified_bessel_k0": "lib.special_modified.scaled_modified_bessel_k0",
    "scaled_modified_bessel_k1": "lib.special_modified.scaled_modified_bessel_k1",
    "acosh": "np.arccosh", "asinh": "np.arcsinh", "atanh": "np.arctanh",
    "frexp_mantissa": "lib.special.frexp_mantissa",
    "frexp_exponent": "lib.special.frexp_exponent",
}
#: op name -> helper, called on (float64 x, int64 n): polynomials of degree n
POLYNOMIAL = {name: f"lib.special_poly.{name}" for name in (
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
    "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
    "laguerre_polynomial_l", "legendre_polynomial_p")}
#: op name -> helper, called on two float64 arguments
BINARY = {"zeta": "lib.special.zeta", "copysign": "np.copysign", "hypot": "np.hypot",
          "nextafter": "np.nextafter"}


def _float(a: str) -> str:
    return f"np.float64({a})"


def _unary(fn: str) -> Renderer:
    return lambda a, t, d: f"{fn}({_float(a[0])})"


def _polynomial(fn: str) -> Renderer:
    return lambda a, t, d: f"{fn}({_float(a[0])}, np.int64({a[1]}))"


def _binary(fn: str) -> Renderer:
    return lambda a, t, d: f"{fn}({_float(a[0])}, {_float(a[1])})"


def _same_precision(fn: str) -> Renderer:
    """nextafter steps by one ulp of the operands' own dtype: no float64 round trip."""
    return lambda a, t, d: f"{fn}({a[0]}, {a[1]})"


RENDERERS: dict[str, Renderer] = {
    **{name: _unary(fn) for name, fn in UNARY.items()},
    **{name: _polynomial(fn) for name, fn in POLYNOMIAL.items()},
    **{name: _binary(fn) for name, fn in BINARY.items()},
    "nextafter": _same_precision("np.nextafter"),
    "polygamma": lambda a, t, d: f"lib.special.polygamma(np.int64({a[0]}), {_float(a[1])})",
    "signbit": lambda a, t, d: f"np.signbit({a[0]})",
}

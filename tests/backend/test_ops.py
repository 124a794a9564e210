"""Per-op suite: every lowered op family equals eager on the simulated device.

Table driven: each table maps an op name to a function, and one test compiles a whole
table for one input layout (one Dynamo graph, one kernel per op), so a cold kernel
cache stays cheap. A mismatch names the op (the key of the output dict).

Layouts are made inside the compiled function (transposes, slices with steps,
stride-0 expands), so the lowering sees non-contiguous values; ``host_*`` layouts pass
a non-contiguous tensor in from the host instead (the DMA gathers it). Inputs hold NaN,
+-inf and signed zeros (:func:`specials`); ``zero_size`` layouts have no elements.
Layouts that exercise indexing every op shares run a representative subset of a table.

Tolerances (the issue's contract): float32 pointwise rtol 1e-5 / atol 1e-6;
reductions, normalisations, matmul, convolution, attention rtol 1e-4 / atol 1e-5.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import POINTWISE_TOL, REDUCTION_TOL, check

Fn = Callable[..., Any]
SPECIAL_VALUES = (math.nan, math.inf, -math.inf, 0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 1.0, -1.0,
                  30.0, -30.0)


# --------------------------------------------------------------------------- inputs


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def specials(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """Random values with NaN, +-inf, signed zeros, halves (rounding ties) and large
    magnitudes spread through the tensor, so that any slice still holds some."""
    x = randn(*shape, dtype=torch.float64, seed=seed) * 2
    flat = x.view(-1)
    for k, value in enumerate(SPECIAL_VALUES if flat.numel() else ()):
        flat[(k * 5 + seed) % flat.numel()] = value
    return x.to(dtype)


def randint(*shape: int, low: int = -20, high: int = 20, dtype: torch.dtype = torch.int32,
            seed: int = 0, nonzero: bool = False) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(low, high, shape, generator=gen, dtype=torch.int64)
    if nonzero:
        x = torch.where(x == 0, torch.ones_like(x), x)
    return x.to(dtype)


def table_fn(table: dict[str, Fn], view: Fn | None = None) -> Fn:
    """One function computing every op of ``table`` on ``view(*args)``: a dict of outputs."""
    def fn(*args: Any) -> dict[str, Any]:
        inputs = view(*args) if view is not None else args
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        return {name: op(*inputs) for name, op in table.items()}
    return fn


def ident(*args: Any) -> Any:
    return args if len(args) > 1 else args[0]


# --------------------------------------------------------------------------- pointwise unary

UNARY: dict[str, Fn] = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log,
    "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin,
    "cos": torch.cos, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    # eager's vectorised float32 erf-GELU gives NaN at +inf (its scalar path gives inf):
    # infinities are clamped to +-50 for the GELUs, NaN still goes through
    "gelu_erf": lambda x: F.gelu(x.clamp(-50, 50)),
    "gelu_tanh": lambda x: F.gelu(x.clamp(-50, 50), approximate="tanh"),
    "silu": F.silu, "erf": torch.erf, "reciprocal": torch.reciprocal, "sign": torch.sign,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round,
    "round_decimals": lambda x: torch.round(x * 10, decimals=2),
    "round_neg_decimals": lambda x: torch.round(x * 1000, decimals=-2),
    "logical_not": torch.logical_not, "isnan": torch.isnan,
}
UNARY_INT: dict[str, Fn] = {
    "neg": torch.neg, "abs": torch.abs, "sign": torch.sign, "floor": torch.floor,
    "ceil": torch.ceil, "round": torch.round, "logical_not": torch.logical_not,
    "isnan": torch.isnan, "relu": torch.relu, "bitwise_not": torch.bitwise_not,
}

#: a subset for layouts whose indexing every op shares (stride-0 loads)
UNARY_SUBSET = ("neg", "exp", "log", "rsqrt", "sin", "sigmoid", "gelu_erf", "erf", "sign",
                "round", "logical_not", "isnan")
#: name -> (input factory, view applied inside the compiled function, ops)
UNARY_LAYOUTS: dict[str, tuple[Callable[[], torch.Tensor], Fn, tuple[str, ...]]] = {
    "contiguous": (lambda: specials(6, 8), ident, tuple(UNARY)),
    "strided": (lambda: specials(10, 12), lambda x: x.t()[::2, 1:9], tuple(UNARY)),
    "expanded": (lambda: specials(6, 1), lambda x: x.expand(6, 8), UNARY_SUBSET),
    "host_strided": (lambda: specials(8, 6).t(), ident, tuple(UNARY)),
    "host_expanded": (lambda: specials(6, 1).expand(6, 8), ident, tuple(UNARY)),
    "zero_size": (lambda: specials(0, 8), ident, tuple(UNARY)),
}


@pytest.mark.parametrize("layout", list(UNARY_LAYOUTS))
def test_unary_float32(layout: str) -> None:
    make, view, names = UNARY_LAYOUTS[layout]
    check(table_fn({name: UNARY[name] for name in names}, view), make(), **POINTWISE_TOL)


UNARY_FLOAT64 = ("neg", "exp", "log1p", "rsqrt", "sin", "tanh", "sigmoid", "gelu_erf",
                 "gelu_tanh", "erf", "sign", "round", "round_decimals", "isnan")


def test_unary_float64() -> None:
    table = {name: UNARY[name] for name in UNARY_FLOAT64}
    check(table_fn(table), specials(6, 8, dtype=torch.float64), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_unary_int(dtype: torch.dtype) -> None:
    check(table_fn(UNARY_INT, lambda x: x.t()), randint(5, 7, dtype=dtype))


def test_unary_bool() -> None:
    table = {"logical_not": torch.logical_not, "bitwise_not": torch.bitwise_not,
             "abs_float": lambda x: x.float().abs()}
    check(table_fn(table), randn(5, 7) > 0)


# --------------------------------------------------------------------------- pointwise binary

BINARY: dict[str, Fn] = {
    "add": torch.add, "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
    "sub": torch.sub, "sub_alpha": lambda a, b: torch.sub(a, b, alpha=0.5), "mul": torch.mul,
    "div": torch.div, "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"), "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "remainder": torch.remainder,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
    "ge": torch.ge, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
}
BINARY_SCALAR: dict[str, Fn] = {
    "add": lambda a: a + 1.5, "rsub": lambda a: 1.5 - a, "mul": lambda a: a * -1.5,
    "div": lambda a: a / 1.5, "rdiv": lambda a: 1.5 / a,
    "div_floor": lambda a: torch.div(a, -1.5, rounding_mode="floor"),
    "div_trunc": lambda a: torch.div(a, 1.5, rounding_mode="trunc"),
    "pow": lambda a: a ** 1.7, "pow_cube": lambda a: a ** 3.0, "pow_half": lambda a: a ** 0.5,
    "pow_square": lambda a: a ** 2, "pow_rsqrt": lambda a: a ** -0.5,
    "pow_reciprocal": lambda a: a ** -1, "pow_inv_square": lambda a: a ** -2.0,
    "rpow": lambda a: 2.0 ** a, "remainder": lambda a: torch.remainder(a, -1.5),
    "maximum": lambda a: torch.clamp_min(a, 0.25), "eq": lambda a: a == 0.5,
    "lt": lambda a: a < 0.5, "ge": lambda a: a >= -0.5,
    "int_scalar": lambda a: a * 3 + 2,
}

BINARY_SUBSET = ("add_alpha", "mul", "div", "div_floor", "pow", "maximum", "remainder", "le",
                 "logical_and")
BINARY_LAYOUTS: dict[str, tuple[Callable[[], tuple], Fn, tuple[str, ...]]] = {
    "broadcast_row": (lambda: (specials(6, 8), specials(8, seed=3)), ident, tuple(BINARY)),
    "strided_col": (lambda: (specials(10, 12), specials(6, 1, seed=2)),
                    lambda a, b: (a.t()[::2, 1:9], b.expand(6, 8)), tuple(BINARY)),
    "same_shape_3d": (lambda: (specials(2, 3, 4), specials(4, 3, 2, seed=4)),
                      lambda a, b: (a, b.permute(2, 1, 0)), BINARY_SUBSET),
    "zero_size": (lambda: (specials(0, 8), specials(8, seed=3)), ident, tuple(BINARY)),
}


@pytest.mark.parametrize("layout", list(BINARY_LAYOUTS))
def test_binary_float32(layout: str) -> None:
    make, view, names = BINARY_LAYOUTS[layout]
    check(table_fn({name: BINARY[name] for name in names}, view), *make(), **POINTWISE_TOL)


def test_binary_scalar_float32() -> None:
    check(table_fn(BINARY_SCALAR, lambda x: x.t()), specials(8, 6), **POINTWISE_TOL)


def test_binary_float64_and_promotion() -> None:
    table = {name: BINARY[name] for name in ("add_alpha", "div", "div_floor", "pow",
                                             "maximum", "remainder", "lt", "logical_or")}
    table |= {"f32_f64": lambda a, b: a.float() * b,
              "int_f64": lambda a, b: (a.nan_to_num(0, 9, -9) * 5).int() + b}
    check(table_fn(table), specials(6, 8, dtype=torch.float64),
          specials(8, dtype=torch.float64, seed=3), rtol=1e-12, atol=1e-14)


BINARY_INT: dict[str, Fn] = {
    "add": torch.add, "sub": lambda a, b: torch.sub(a, b, alpha=3), "mul": torch.mul,
    "div": torch.div, "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "floor_divide": torch.floor_divide, "remainder": torch.remainder,
    "pow": lambda a, b: torch.pow(a, b.abs() % 4), "maximum": torch.maximum,
    "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge, "logical_and": torch.logical_and,
    "logical_or": torch.logical_or, "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "with_float": lambda a, b: a * 0.5 + b, "int_scalar": lambda a, b: a * 3 - 7,
}


@pytest.mark.parametrize("dtypes", [(torch.int32, torch.int32), (torch.int32, torch.int64)],
                         ids=["i32", "i32_i64"])
def test_binary_int(dtypes: tuple[torch.dtype, torch.dtype]) -> None:
    a = randint(6, 8, dtype=dtypes[0])
    b = randint(8, dtype=dtypes[1], seed=1, nonzero=True)
    table = BINARY_INT if dtypes[0] == dtypes[1] else {
        name: BINARY_INT[name] for name in ("add", "sub", "mul", "div", "div_floor",
                                            "div_trunc", "remainder", "pow", "maximum", "ge",
                                            "bitwise_and", "with_float")}
    check(table_fn(table, lambda a, b: (a.t().t(), b)), a, b)


ZERO_DIM: dict[str, Fn] = {
    "int_plus_f64_0d": lambda i, x, f0, i0: i + f0,
    "int_times_i64_0d": lambda i, x, f0, i0: i * i0,
    "f32_times_f64_0d": lambda i, x, f0, i0: x * f0,
    "0d_plus_0d": lambda i, x, f0, i0: f0 + i0,
    "where_0d": lambda i, x, f0, i0: torch.where(i > 0, f0, x),
    "lt_0d": lambda i, x, f0, i0: i < f0,
}


def test_zero_dim_tensor_operands() -> None:
    """0-d tensors promote like scalars (their dtype category only)."""
    check(table_fn(ZERO_DIM), randint(6, 8), specials(6, 8),
          torch.tensor(2.5, dtype=torch.float64), torch.tensor(3))


def test_binary_bool() -> None:
    table = {"and": torch.logical_and, "or": torch.logical_or, "xor": torch.logical_xor,
             "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
             "bitwise_xor": torch.bitwise_xor, "eq": torch.eq, "add_int": lambda a, b: a + b.int(),
             "mul_float": lambda a, b: a * b.float()}
    check(table_fn(table, lambda a, b: (a.t(), b)), randn(7, 5) > 0, randn(7, seed=1) > 0)


# --------------------------------------------------------------------------- where, clamp, casts

SELECT: dict[str, Fn] = {
    "where": lambda x, y, c: torch.where(c, x, y),
    "where_scalar_other": lambda x, y, c: torch.where(c, x, 0.0),
    "where_scalar_self": lambda x, y, c: torch.where(c, -1.0, y),
    "where_scalars": lambda x, y, c: torch.where(c, 1.0, 0.0),
    "where_int_float": lambda x, y, c: torch.where(c, torch.ones_like(x, dtype=torch.int32), y),
    "masked_fill": lambda x, y, c: x.masked_fill(c, -math.inf),
    "clamp": lambda x, y, c: torch.clamp(x, -0.5, 0.75),
    "clamp_min": lambda x, y, c: torch.clamp(x, min=0.0),
    "clamp_max": lambda x, y, c: torch.clamp(x, max=0.0),
    "clamp_tensor": lambda x, y, c: torch.clamp(x, y, y + 1),
    "clamp_tensor_min": lambda x, y, c: torch.clamp(x, min=y),
}


@pytest.mark.parametrize("layout", ["broadcast", "strided"])
def test_where_clamp(layout: str) -> None:
    x, y, c = specials(6, 8), specials(8, seed=1), randn(6, 1, seed=2) > 0
    if layout == "broadcast":
        check(table_fn(SELECT), x, y, c)
    else:
        check(table_fn(SELECT, lambda x, y, c: (x.t()[:, 1:7], y[:6], c.expand(6, 6))),
              specials(8, 6), y, c)


def test_clamp_int() -> None:
    table = {"clamp": lambda x: torch.clamp(x, -3, 5), "clamp_min": lambda x: x.clamp_min(2),
             "clamp_float_bound": lambda x: torch.clamp(x, max=2.5)}
    check(table_fn(table), randint(6, 8, dtype=torch.int64))


CASTS: dict[str, Fn] = {
    "to_f64": lambda x, i, b: x.double(), "f64_to_f32": lambda x, i, b: x.double().exp().float(),
    "to_bool": lambda x, i, b: x.bool(), "to_i32": lambda x, i, b: x.nan_to_num(0, 100, -100).int(),
    "to_i64": lambda x, i, b: (x.nan_to_num(0, 100, -100) * 10).long(),
    "i32_to_f32": lambda x, i, b: i.float(), "i32_to_i64": lambda x, i, b: i.long(),
    "i32_to_bool": lambda x, i, b: i.bool(), "i64_to_i32": lambda x, i, b: i.long().int(),
    "bool_to_f32": lambda x, i, b: b.float(), "bool_to_i64": lambda x, i, b: b.long(),
    "type_as": lambda x, i, b: i.type_as(x),
    "i32_to_i8": lambda x, i, b: i.to(torch.int8), "i32_to_u8": lambda x, i, b: i.to(torch.uint8),
    "bool_to_u8": lambda x, i, b: b.to(torch.uint8),
    "f64_overflow_to_f32": lambda x, i, b: (x.double() * 1e300).float(),
}


def test_dtype_conversion() -> None:
    check(table_fn(CASTS, lambda x, i, b: (x.t(), i.t(), b.t())), specials(8, 6),
          randint(8, 6), randn(8, 6) > 0)


# --------------------------------------------------------------------------- reductions

REDUCTIONS: dict[str, Fn] = {
    "sum": torch.sum, "sum_d1_keep": lambda x: x.sum(1, keepdim=True),
    "mean_f64": lambda x: x.mean(1, dtype=torch.float64),
    "sum_d02": lambda x: x.sum((0, 2)), "mean": torch.mean,
    "mean_d2_keep": lambda x: x.mean(-1, keepdim=True), "mean_d01": lambda x: x.mean((0, 1)),
    "amax_d2": lambda x: x.amax(2), "amax_d01_keep": lambda x: x.amax((0, 1), keepdim=True),
    "amin": lambda x: x.amin((0, 1, 2)), "amin_d1": lambda x: x.amin(1),
    "argmax": torch.argmax, "argmax_d1_keep": lambda x: x.argmax(1, keepdim=True),
    "argmax_all_keep": lambda x: x.argmax(keepdim=True), "max_all": torch.max,
    "argmin_d2": lambda x: x.argmin(-1), "argmin": torch.argmin,
    "max_d1": lambda x: x.max(1), "min_d0": lambda x: x.min(0, keepdim=True),
    "var_d1": lambda x: x.var(1), "var_c0": lambda x: x.var(correction=0),
    "var_d02_keep": lambda x: x.var((0, 2), keepdim=True), "std_d2": lambda x: x.std(-1),
    "std": torch.std, "var_mean": lambda x: torch.var_mean(x, 1),
    "prod_d1": lambda x: (x * 0.1 + 1).prod(1), "prod": lambda x: (x * 0.1 + 1).prod(),
    "any_d1": lambda x: (x > 1).any(1), "all_d2_keep": lambda x: (x > -2).all(2, keepdim=True),
    "any": lambda x: (x > 2).any(), "all": lambda x: x.all(),
}

#: a representative subset (every op, fewer dim choices) for the costlier layouts
REDUCTIONS_SUBSET = ("sum_d1_keep", "sum_d02", "mean", "amax_d01_keep", "amin_d1",
                     "argmax_d1_keep", "argmin", "var_d02_keep", "std_d2", "prod_d1",
                     "any_d1", "all_d2_keep")
REDUCTION_LAYOUTS: dict[str, tuple[Callable[[], torch.Tensor], Fn, tuple[str, ...]]] = {
    "contiguous": (lambda: randn(4, 5, 6), ident, tuple(REDUCTIONS)),
    "permuted": (lambda: randn(6, 4, 5), lambda x: x.permute(1, 2, 0), REDUCTIONS_SUBSET),
    "sliced_expanded": (lambda: randn(4, 1, 12), lambda x: x[..., ::2].expand(4, 5, 6),
                        REDUCTIONS_SUBSET),
}


@pytest.mark.parametrize("layout", list(REDUCTION_LAYOUTS))
def test_reductions_float32(layout: str) -> None:
    make, view, names = REDUCTION_LAYOUTS[layout]
    table = {name: REDUCTIONS[name] for name in names}
    check(table_fn(table, view), make(), **REDUCTION_TOL)


NAN_REDUCTIONS = ("sum_d1_keep", "mean_d2_keep", "amax_d2", "amin_d1", "argmax_d1_keep",
                  "argmin_d2", "max_d1", "var_d1", "prod_d1", "any_d1", "all")


def test_reductions_nan_inf() -> None:
    table = {name: REDUCTIONS[name] for name in NAN_REDUCTIONS}
    check(table_fn(table), specials(4, 5, 6), **REDUCTION_TOL)


def test_reductions_float64() -> None:
    table = {name: REDUCTIONS[name] for name in REDUCTIONS_SUBSET}
    check(table_fn(table), randn(4, 5, 6, dtype=torch.float64), rtol=1e-10, atol=1e-12)


REDUCTIONS_INT: dict[str, Fn] = {
    "sum": torch.sum, "sum_d1": lambda x: x.sum(1),
    "sum_i32": lambda x: x.sum(1, dtype=torch.int32),
    "mean_float": lambda x: x.float().mean(0), "amax": lambda x: x.amax(1),
    "amin": lambda x: x.amin((0, 2), keepdim=True), "argmax": lambda x: x.argmax(2),
    "argmin": torch.argmin, "prod": lambda x: (x % 3).prod(1), "any": lambda x: x.any(1),
    "all": lambda x: x.all(), "max_d2": lambda x: x.max(2),
}


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_reductions_int(dtype: torch.dtype) -> None:
    check(table_fn(REDUCTIONS_INT, lambda x: x.transpose(0, 2)), randint(6, 5, 4, dtype=dtype))


def test_reductions_bool() -> None:
    table = {"sum": lambda b: b.sum(1), "any": lambda b: b.any(0), "all": lambda b: b.all(1),
             "amax": lambda b: b.amax(1), "argmax_int": lambda b: b.int().argmax(1)}
    check(table_fn(table), randn(5, 7) > 0)


@pytest.mark.filterwarnings("ignore:var.*degrees of freedom:UserWarning")
def test_reductions_zero_size() -> None:
    table = {"sum_empty_dim": lambda x: x.sum(1), "mean_empty_dim": lambda x: x.mean(1),
             "prod_empty_dim": lambda x: x.prod(1), "any_empty_dim": lambda x: x.any(1),
             "all_empty_dim": lambda x: x.all(1), "var_empty_dim": lambda x: x.var(1),
             "sum_into_empty": lambda x: x.sum(2), "amax_into_empty": lambda x: x.amax(2)}
    check(table_fn(table), randn(3, 0, 4), **REDUCTION_TOL)


# --------------------------------------------------------------------------- softmax

SOFTMAX: dict[str, Fn] = {
    "softmax_last": lambda x: torch.softmax(x, -1), "softmax_d0": lambda x: torch.softmax(x, 0),
    "log_softmax_last": lambda x: torch.log_softmax(x, -1),
    "log_softmax_d1": lambda x: torch.log_softmax(x, 1),
    "softmax_f64": lambda x: torch.softmax(x, -1, dtype=torch.float64),
}


SOFTMAX_LAYOUTS: dict[str, tuple[Callable[[], torch.Tensor], Fn, tuple[str, ...]]] = {
    "contiguous": (lambda: randn(3, 4, 7) * 4, ident, tuple(SOFTMAX)),
    "transposed": (lambda: randn(3, 7, 4) * 4, lambda x: x.transpose(1, 2), tuple(SOFTMAX)),
    "masked": (lambda: randn(3, 4, 7) * 4,
               lambda x: x.masked_fill(torch.arange(7) > 4, -math.inf),
               ("softmax_last", "log_softmax_last")),
}


@pytest.mark.parametrize("layout", list(SOFTMAX_LAYOUTS))
def test_softmax(layout: str) -> None:
    make, view, names = SOFTMAX_LAYOUTS[layout]
    check(table_fn({name: SOFTMAX[name] for name in names}, view), make(), **REDUCTION_TOL)


def test_softmax_all_masked_row_is_nan() -> None:
    x = randn(4, 6).masked_fill(torch.tensor([[True], [False], [False], [True]]), -math.inf)
    check(table_fn({"softmax": lambda x: torch.softmax(x, -1),
                    "log_softmax": lambda x: torch.log_softmax(x, -1)}), x, **REDUCTION_TOL)


# --------------------------------------------------------------------------- matmul

MATMUL: dict[str, Fn] = {
    "mm": lambda a, b, a3, b3, bias: a @ b,
    "mm_t": lambda a, b, a3, b3, bias: b.t() @ a.t(),
    "mm_expanded": lambda a, b, a3, b3, bias: a @ b[:, :1].expand(7, 3),
    "mm_sliced": lambda a, b, a3, b3, bias: a[1:, ::2] @ b[:4],
    "bmm": lambda a, b, a3, b3, bias: torch.bmm(a3, b3),
    "bmm_t": lambda a, b, a3, b3, bias: torch.bmm(b3.transpose(1, 2), a3.transpose(1, 2)),
    "bmm_broadcast": lambda a, b, a3, b3, bias: torch.bmm(a[None].expand(2, 5, 7), b3),
    "matmul_3d_2d": lambda a, b, a3, b3, bias: a3 @ b,
    "addmm": lambda a, b, a3, b3, bias: torch.addmm(bias, a, b),
    "addmm_alpha_beta": lambda a, b, a3, b3, bias: torch.addmm(bias[None], a, b, beta=0.5, alpha=2),
    "addmm_beta0_nan": lambda a, b, a3, b3, bias: torch.addmm(bias / 0.0 * 0, a, b, beta=0),
    "linear": lambda a, b, a3, b3, bias: F.linear(a3, b.t(), bias),
    "baddbmm": lambda a, b, a3, b3, bias: torch.baddbmm(bias, a3, b3),
    "baddbmm_alpha_beta": lambda a, b, a3, b3, bias: torch.baddbmm(bias, a3, b3, beta=-1,
                                                                   alpha=0.5),
}


def _matmul_inputs(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return (randn(5, 7, dtype=dtype), randn(7, 3, dtype=dtype, seed=1),
            randn(2, 5, 7, dtype=dtype, seed=2), randn(2, 7, 3, dtype=dtype, seed=3),
            randn(3, dtype=dtype, seed=4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matmul(dtype: torch.dtype) -> None:
    tol = REDUCTION_TOL if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    check(table_fn(MATMUL), *_matmul_inputs(dtype), **tol)


def test_matmul_int_and_zero_size() -> None:
    table = {"mm_int": lambda a, b, e0, e1: a @ b,
             "bmm_int": lambda a, b, e0, e1: torch.bmm(a[None], b[None]),
             "k_zero": lambda a, b, e0, e1: e0 @ e1, "m_zero": lambda a, b, e0, e1: e1.t()[:0] @ e1,
             "addmm_k_zero": lambda a, b, e0, e1: torch.addmm(torch.ones(3), e0, e1)}
    check(table_fn(table), randint(5, 7, dtype=torch.int64),
          randint(7, 3, dtype=torch.int64, seed=1), randn(5, 0), randn(0, 3), **REDUCTION_TOL)


# --------------------------------------------------------------------------- convolution, pooling

CONV: dict[str, Fn] = {
    "plain": lambda x, w, wg, b: F.conv2d(x, w),
    "bias_pad": lambda x, w, wg, b: F.conv2d(x, w, b, padding=1),
    "stride_dilation": lambda x, w, wg, b: F.conv2d(x, w, b, stride=2, padding=2, dilation=2),
    "groups": lambda x, w, wg, b: F.conv2d(x, wg, b, stride=(2, 1), padding=(1, 0), groups=2),
    "strided_input": lambda x, w, wg, b: F.conv2d(x.transpose(2, 3), w, b, padding=1),
    "pointwise_1x1": lambda x, w, wg, b: F.conv2d(x, w[:, :, :1, :1]),
    "padding_same": lambda x, w, wg, b: F.conv2d(x, w, padding="same"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_conv2d(dtype: torch.dtype) -> None:
    args = (randn(2, 4, 9, 8, dtype=dtype), randn(6, 4, 3, 3, dtype=dtype, seed=1),
            randn(6, 2, 3, 2, dtype=dtype, seed=2), randn(6, dtype=dtype, seed=3))
    check(table_fn(CONV), *args, **REDUCTION_TOL)


POOL: dict[str, Fn] = {
    "max": lambda x: F.max_pool2d(x, 2),
    "max_pad_stride": lambda x: F.max_pool2d(x, 3, stride=2, padding=1),
    "max_dilation": lambda x: F.max_pool2d(x, 2, stride=1, dilation=2),
    "max_ceil": lambda x: F.max_pool2d(x, 3, stride=2, ceil_mode=True),
    "max_indices": lambda x: F.max_pool2d(x, 2, return_indices=True),
    "avg": lambda x: F.avg_pool2d(x, 2),
    "avg_pad": lambda x: F.avg_pool2d(x, 3, stride=2, padding=1),
    "avg_pad_exclude": lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
    "avg_ceil": lambda x: F.avg_pool2d(x, 3, stride=2, ceil_mode=True),
    "avg_divisor": lambda x: F.avg_pool2d(x, 2, divisor_override=3),
    "adaptive_1": lambda x: F.adaptive_avg_pool2d(x, 1),
    "adaptive_3x4": lambda x: F.adaptive_avg_pool2d(x, (3, 4)),
    "adaptive_up": lambda x: F.adaptive_avg_pool2d(x, (9, 10)),
}


@pytest.mark.parametrize("layout", ["contiguous", "strided_nan"])
def test_pooling(layout: str) -> None:
    if layout == "contiguous":
        check(table_fn(POOL), randn(2, 3, 7, 9), **REDUCTION_TOL)
    else:
        check(table_fn(POOL, lambda x: x.transpose(2, 3)), specials(2, 3, 9, 7), **REDUCTION_TOL)


# --------------------------------------------------------------------------- indexing

INDEXING: dict[str, Fn] = {
    "embedding": lambda x, i, j: F.embedding(i, x),
    "embedding_padding_idx": lambda x, i, j: F.embedding(i, x, padding_idx=2),
    "index_select_d0": lambda x, i, j: torch.index_select(x, 0, i[0]),
    "index_select_d1": lambda x, i, j: torch.index_select(x, 1, j),
    "gather_d1": lambda x, i, j: torch.gather(x, 1, i % 4),
    "gather_d0": lambda x, i, j: torch.gather(x, 0, i.t()),
    "index_rows": lambda x, i, j: x[i],
    "index_cols": lambda x, i, j: x[:, j],
    "index_negative": lambda x, i, j: x[-1 - i[0]],
    "index_pair": lambda x, i, j: x[i[0], j[:1]],
    "index_broadcast": lambda x, i, j: x[i[:, :1], j[None, :3]],
}


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_indexing(layout: str) -> None:
    x = randn(10, 4) if layout == "contiguous" else randn(4, 10)
    view = ident if layout == "contiguous" else (lambda x, i, j: (x.t(), i, j))
    i = randint(2, 5, low=0, high=10, dtype=torch.int64)
    j = torch.tensor([3, 0, 1, 3])
    check(table_fn(INDEXING, view), x, i, j)


INDEXING_3D: dict[str, Fn] = {
    "index_first_last": lambda x, i, j: x[i, :, j],
    "index_middle_last": lambda x, i, j: x[:, i, j],
    "index_last": lambda x, i, j: x[..., j], "index_then_index": lambda x, i, j: x[i][..., j[0]],
    "embedding_0d": lambda x, i, j: F.embedding(i[0, 0], x[0]),
}


def test_indexing_3d() -> None:
    """Advanced indexing with index tensors apart (result dims first) or adjacent."""
    check(table_fn(INDEXING_3D), randn(5, 6, 4), randint(2, 3, low=0, high=4, dtype=torch.int64),
          torch.tensor([[3], [-1]]))


def test_indexing_int32_indices_and_int_values() -> None:
    table = {"index_select": lambda x, i: torch.index_select(x, 0, i),
             "index": lambda x, i: x[i], "embedding_like": lambda x, i: x[i.long()] * 2}
    check(table_fn(table), randint(6, 3, dtype=torch.int64),
          torch.tensor([5, 0, 2, 2], dtype=torch.int32))


# --------------------------------------------------------------------------- normalisation

NORMS: dict[str, Fn] = {
    "layer_norm": lambda x, w, b, rm, rv: F.layer_norm(x, (8,), w, b),
    "layer_norm_2d": lambda x, w, b, rm, rv: F.layer_norm(x, (6, 8), eps=1e-3),
    "layer_norm_strided": lambda x, w, b, rm, rv: F.layer_norm(x.transpose(0, 1), (8,), w, b),
    "batch_norm_eval": lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w[:6], b[:6]),
    "batch_norm_eval_no_affine": lambda x, w, b, rm, rv: F.batch_norm(x[..., None], rm, rv),
    "batch_norm_eval_2d": lambda x, w, b, rm, rv: F.batch_norm(x[:, :, 0], rm, rv, w[2:], b[2:]),
    "layer_norm_all": lambda x, w, b, rm, rv: F.layer_norm(x, (4, 6, 8)),
    "group_norm": lambda x, w, b, rm, rv: F.group_norm(x, 3, rm, rv),
    "group_norm_no_affine": lambda x, w, b, rm, rv: F.group_norm(x, 2, eps=1e-3),
}


def test_norms_float32() -> None:
    args = (randn(4, 6, 8) * 3 + 1, randn(8, seed=1), randn(8, seed=2), randn(6, seed=3),
            randn(6, seed=4).abs() + 0.5)
    check(table_fn(NORMS), *args, **REDUCTION_TOL)


def test_batch_norm_train_updates_running_stats() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, rm: torch.Tensor,
           rv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2)
        y2 = F.batch_norm(x[:, :, 0], None, None, training=True)
        return y, y2, rm, rv
    args = (randn(4, 3, 5, 6) * 2 + 1, randn(3, seed=1), randn(3, seed=2), randn(3, seed=3),
            randn(3, seed=4).abs() + 0.5)
    check(fn, *args, **REDUCTION_TOL)


# --------------------------------------------------------------------------- views

VIEWS: dict[str, Fn] = {
    "reshape_merge": lambda x: x.reshape(24, 8), "reshape_split": lambda x: x.reshape(4, 2, 3, 8),
    "reshape_infer": lambda x: x.reshape(-1, 12), "reshape_flat": lambda x: x.reshape(-1),
    "reshape_regroup": lambda x: x.reshape(8, 3, 8), "flatten": lambda x: x.flatten(1),
    "reshape_ones": lambda x: x.reshape(1, 4, 1, 48, 1),
    "reshape_mixed": lambda x: x.reshape(2, 12, 2, 4),
    "unflatten": lambda x: x.unflatten(2, (2, 4)), "permute": lambda x: x.permute(2, 0, 1),
    "transpose": lambda x: x.transpose(0, 2), "expand": lambda x: x[:, :1].expand(4, 6, 8),
    "expand_new_dim": lambda x: x[0, 0].expand(3, 8),
    "squeeze": lambda x: x[:, :1].squeeze(1), "squeeze_all": lambda x: x[:1, 2:3].squeeze(),
    "unsqueeze": lambda x: x.unsqueeze(1), "unsqueeze_last": lambda x: x.unsqueeze(-1),
    "slice": lambda x: x[1:3, ::2, -3:], "slice_step": lambda x: x[:, 1::3, ::2],
    "narrow": lambda x: x.narrow(2, 2, 4), "select": lambda x: x[:, 2],
    "select_neg": lambda x: x[-1, :, -2],
    "t_2d": lambda x: x[0].t(), "view_of_view": lambda x: x.transpose(0, 1).reshape(6, 32)[::2],
    "unbind": lambda x: x.unbind(1)[2], "diagonal": lambda x: x.diagonal(0, 1, 2),
}


@pytest.mark.parametrize("layout", ["input", "lazy", "strided"])
def test_views(layout: str) -> None:
    view = {"input": ident, "lazy": lambda x: x * 2 + 1,
            "strided": lambda x: x.permute(1, 2, 0)}[layout]
    x = randn(4, 6, 8) if layout != "strided" else randn(8, 4, 6)
    check(table_fn(VIEWS, view), x)


def test_view_and_as_strided() -> None:
    table = {"view": lambda x: x.view(6, 4, 8), "view_dtype_int": lambda x: x.view(-1, 8)[1:],
             "as_strided": lambda x: torch.as_strided(x, (3, 4), (8, 2), 5),
             "as_strided_overlap": lambda x: torch.as_strided(x, (4, 4), (1, 1)),
             "as_strided_lazy": lambda x: torch.as_strided(x * 2, (5, 3), (3, 1), 1)}
    check(table_fn(table), randn(4, 6, 8))


# --------------------------------------------------------------------------- cat, stack, split

JOIN: dict[str, Fn] = {
    "cat_d0": lambda a, b, c, e: torch.cat([a, b]),
    "cat_d1_strided": lambda a, b, c, e: torch.cat([a, b.t().t(), a[:, 1::2]], 1),
    "cat_promote": lambda a, b, c, e: torch.cat([a, c]),
    "cat_empty": lambda a, b, c, e: torch.cat([a, e, b]),
    "cat_lazy": lambda a, b, c, e: torch.cat([a * 2, b.exp()], -1),
    "stack_d0": lambda a, b, c, e: torch.stack([a, b]),
    "stack_d2": lambda a, b, c, e: torch.stack([a, b.t().contiguous().t(), a + b], 2),
    "split": lambda a, b, c, e: torch.split(a, 2, dim=1),
    "split_sizes": lambda a, b, c, e: torch.split(a * 3, [1, 4, 0, 1], dim=1),
    "chunk": lambda a, b, c, e: b.chunk(2, 0),
}


def test_cat_stack_split() -> None:
    check(table_fn(JOIN), randn(4, 6), randn(4, 6, seed=1), randint(4, 6), randn(0, 6))


# --------------------------------------------------------------------------- constants, scans

CONSTANTS: dict[str, Fn] = {
    "full": lambda x: torch.full((3, 4), 2.5), "full_int": lambda x: torch.full((2, 3), 7),
    "full_bool": lambda x: torch.full((2,), True),
    "full_nan": lambda x: torch.full((2, 2), math.nan),
    "zeros": lambda x: torch.zeros(2, 3, dtype=torch.int64), "ones": lambda x: torch.ones(5),
    "zeros_like": lambda x: torch.zeros_like(x),
    "ones_like_int": lambda x: torch.ones_like(x, dtype=torch.int32),
    "full_like_inf": lambda x: torch.full_like(x, -math.inf),
    "new_full": lambda x: x.new_full((2,), 3.0),
    "arange": lambda x: torch.arange(10), "arange_step": lambda x: torch.arange(2, 11, 3),
    "arange_float": lambda x: torch.arange(0, 1, 0.125),
    "arange_tenth": lambda x: torch.arange(0, 1, 0.1),
    "arange_neg": lambda x: torch.arange(5, -3, -2.5),
    "arange_i32": lambda x: torch.arange(4, dtype=torch.int32),
    "iota": lambda x: torch.ops.prims.iota.default(5, start=2, step=3, dtype=torch.int64,
                                                   device=torch.device("cpu"), requires_grad=False),
    "scalar_tensor": lambda x: torch.scalar_tensor(3.5),
    "scalar_tensor_int": lambda x: torch.scalar_tensor(2, dtype=torch.int64),
    "zero_size_full": lambda x: torch.full((0, 3), 1.0),
    "used": lambda x: x + torch.arange(8) * torch.ones(6, 1),
}


def test_constants() -> None:
    check(table_fn(CONSTANTS), randn(6, 8))


TRIANGLE_SCAN: dict[str, Fn] = {
    "tril": torch.tril, "triu_1": lambda x: torch.triu(x, 1),
    "tril_neg": lambda x: torch.tril(x, -2),
    "triu_wide": lambda x: torch.triu(x[..., :4, :], -1), "tril_bool": lambda x: torch.tril(x > 0),
    "cumsum_last": lambda x: torch.cumsum(x, -1), "cumsum_d0": lambda x: torch.cumsum(x, 0),
    "cumsum_d1_f64": lambda x: torch.cumsum(x, 1, dtype=torch.float64),
    "cumsum_int": lambda x: torch.cumsum((x.nan_to_num(0, 100, -100) * 10).int(), 1),
    "cumsum_float_to_i64": lambda x: torch.cumsum(x.nan_to_num(0, 100, -100) * 10, 0,
                                                  dtype=torch.int64),
    "cumsum_bool": lambda x: torch.cumsum(x > 0, 2),
}


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_tril_triu_cumsum(layout: str) -> None:
    if layout == "contiguous":
        check(table_fn(TRIANGLE_SCAN), specials(3, 5, 6), **REDUCTION_TOL)
    else:
        check(table_fn(TRIANGLE_SCAN, lambda x: x.transpose(0, 2)), specials(6, 5, 3),
              **REDUCTION_TOL)


def test_cumsum_zero_size() -> None:
    check(table_fn({"cumsum": lambda x: torch.cumsum(x, 1), "tril": torch.tril}), randn(2, 0, 3))


# --------------------------------------------------------------------------- attention

ATTENTION: dict[str, Fn] = {
    "causal": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "float_mask": lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
    "bool_mask_scale": lambda q, k, v, m: F.scaled_dot_product_attention(
        q, k, v, attn_mask=m > 0, scale=0.3),
    "strided_cross_len": lambda q, k, v, m: F.scaled_dot_product_attention(
        q.transpose(1, 2).contiguous().transpose(1, 2)[:, :, 1:4],
        k.transpose(2, 3).contiguous().transpose(2, 3), v),
}


def test_scaled_dot_product_attention() -> None:
    q, k, v = randn(2, 3, 5, 8), randn(2, 3, 7, 8, seed=1), randn(2, 3, 7, 8, seed=2)
    mask = randn(5, 7, seed=3)
    mask[:, 0] = 1.0  # no fully masked row in the boolean mask
    check(table_fn(ATTENTION), q, k, v, mask, **REDUCTION_TOL)


# --------------------------------------------------------------------------- parallel kernels

LARGE: dict[str, Fn] = {
    "pointwise": lambda x: torch.sigmoid(x) * 2 - x, "sum_rows": lambda x: x.sum(1),
    "argmax_cols": lambda x: x.argmax(0), "amax_all": lambda x: x.amax(),
    "cumsum": lambda x: x.cumsum(0), "max_pool": lambda x: F.max_pool2d(x[None], 2),
    "avg_pool": lambda x: F.avg_pool2d(x[None, None], 3, stride=2, padding=1),
}


def test_large_tensors_take_the_parallel_kernels() -> None:
    """Past the prange thresholds (64 Ki elements for generated kernels, 32 Ki for
    templates) kernels run in parallel: same results."""
    check(table_fn(LARGE, lambda x: x.t()), specials(300, 256), **REDUCTION_TOL)

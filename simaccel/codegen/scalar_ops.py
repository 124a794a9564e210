"""Source templates of the scalar operations kernel expressions use.

``render(name, args, arg_dtypes, dtype)`` returns Python source computing the
operation on already-rendered operand sources. The emitter wraps every result in
its dtype's constructor (``np.float32(...)``), so each operation rounds exactly
once to its result dtype, as PyTorch's CPU kernels do.
"""
from __future__ import annotations

from typing import Callable

from simaccel.codegen.dtypes import is_float
from simaccel.codegen.special_ops import RENDERERS as SPECIAL_RENDERERS

Renderer = Callable[[list[str], list[str], str], str]

_UNARY_NP = {
    "exp": "lib.vexp", "log": "lib.vlog", "log1p": "np.log1p", "expm1": "np.expm1",
    "sqrt": "np.sqrt", "sin": "np.sin", "cos": "np.cos", "tan": "np.tan", "tanh": "lib.vtanh",
    "asin": "np.arcsin", "acos": "np.arccos", "atan": "np.arctan", "sinh": "np.sinh",
    "cosh": "np.cosh", "log2": "np.log2", "log10": "np.log10", "exp2": "np.exp2",
    "floor": "np.floor", "ceil": "np.ceil", "trunc": "np.trunc", "abs": "np.abs",
    "isinf": "np.isinf", "isfinite": "np.isfinite",
}
#: float32 ops with a vectorisable helper that is exact only for arguments that
#: ``lib.trig_arg_wide`` does not flag; the emitter uses it where a kernel can recompute
#: itself with the libm op above when some argument is flagged (see emit.py).
RANGE_CHECKED = {"sin": "lib.vsin", "cos": "lib.vcos"}
_HELPERS_UNARY = {"sigmoid": "lib.sigmoid", "erf": "lib.verf", "round": "lib.round_half_even"}
_BINARY_INFIX = {"add": "+", "sub": "-", "mul": "*", "bitwise_and": "&", "bitwise_or": "|",
                 "bitwise_xor": "^", "lshift": "<<", "rshift": ">>"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_HELPERS_BINARY = {"maximum": "lib.maximum", "minimum": "lib.minimum", "fmax": "lib.fmax",
                   "fmin": "lib.fmin", "atan2": "np.arctan2"}


def _unary(fn: str) -> Renderer:
    return lambda a, t, d: f"{fn}({a[0]})"


def _infix(op: str) -> Renderer:
    return lambda a, t, d: f"({a[0]} {op} {a[1]})"


def _call2(fn: str) -> Renderer:
    return lambda a, t, d: f"{fn}({a[0]}, {a[1]})"


def _truediv(a: list[str], t: list[str], d: str) -> str:
    return f"({a[0]} / {a[1]})"


def _floordiv(a: list[str], t: list[str], d: str) -> str:
    if is_float(d):
        return f"lib.float_floor_divide({a[0]}, {a[1]})"
    return f"({a[0]} // {a[1]})"


def _truncdiv(a: list[str], t: list[str], d: str) -> str:
    if is_float(d):
        return f"np.trunc({a[0]} / {a[1]})"
    return f"lib.int_trunc_divide({a[0]}, {a[1]})"


def _remainder(a: list[str], t: list[str], d: str) -> str:
    if is_float(d):
        return f"lib.float_remainder({a[0]}, {a[1]})"
    return f"({a[0]} % {a[1]})"


def _fmod(a: list[str], t: list[str], d: str) -> str:
    if is_float(d):
        return f"np.fmod({a[0]}, {a[1]})"
    return f"lib.int_fmod({a[0]}, {a[1]})"


def _pow(a: list[str], t: list[str], d: str) -> str:
    if is_float(d):
        return f"({a[0]} ** {a[1]})"
    return f"lib.int_pow({a[0]}, {a[1]})"


def _neg(a: list[str], t: list[str], d: str) -> str:
    return f"(not {a[0]})" if d == "bool" else f"(-{a[0]})"


def _bitwise_not(a: list[str], t: list[str], d: str) -> str:
    return f"(not {a[0]})" if d == "bool" else f"(~{a[0]})"


def _truth(src: str, dtype: str) -> str:
    return src if dtype == "bool" else f"({src} != 0)"


def _logical(op: str) -> Renderer:
    return lambda a, t, d: f"({_truth(a[0], t[0])} {op} {_truth(a[1], t[1])})"


def _cast(a: list[str], t: list[str], d: str) -> str:
    if d == "bool":
        return _truth(a[0], t[0])
    if is_float(t[0]) and not is_float(d):
        # float -> int truncates toward zero, as in PyTorch; go through int64 first
        return f"np.int64({a[0]})"
    return a[0]


RENDERERS: dict[str, Renderer] = {
    **{name: _unary(fn) for name, fn in _UNARY_NP.items()},
    **{name: _unary(fn) for name, fn in _HELPERS_UNARY.items()},
    **{name: _infix(op) for name, op in _BINARY_INFIX.items()},
    **{name: _infix(op) for name, op in _COMPARE.items()},
    **{name: _call2(fn) for name, fn in _HELPERS_BINARY.items()},
    "neg": _neg,
    "bitwise_not": _bitwise_not,
    "reciprocal": lambda a, t, d: f"(1.0 / {a[0]})",
    "rsqrt": lambda a, t, d: f"(1.0 / np.sqrt({a[0]}))",
    "sign": lambda a, t, d: f"lib.sign({a[0]})",
    "isnan": lambda a, t, d: f"({a[0]} != {a[0]})",
    "logical_not": lambda a, t, d: f"(not {_truth(a[0], t[0])})",
    "logical_and": _logical("and"),
    "logical_or": _logical("or"),
    "logical_xor": _logical("!="),
    "truediv": _truediv,
    "floordiv": _floordiv,
    "truncdiv": _truncdiv,
    "remainder": _remainder,
    "fmod": _fmod,
    "pow": _pow,
    "where": lambda a, t, d: f"({a[1]} if {_truth(a[0], t[0])} else {a[2]})",
    "fma": lambda a, t, d: f"lib.fma({a[0]}, {a[1]}, {a[2]})",
    "random_bits": lambda a, t, d: f"lib.random_bits({a[0]}, {a[1]}, {a[2]})",
    "cast": _cast,
    "identity": lambda a, t, d: a[0],
    **SPECIAL_RENDERERS,
}


def render(name: str, args: list[str], arg_dtypes: list[str], dtype: str) -> str:
    """Source of op ``name`` on ``args``; raises KeyError for an unknown op."""
    return RENDERERS[name](args, arg_dtypes, dtype)

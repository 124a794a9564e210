"""Sizes during lowering: Python ints, or ``torch.SymInt`` for sizes Dynamo made dynamic.

Lowerings do size arithmetic with plain operators; a SymInt stays symbolic. Three kinds of
decision use three tools (as Inductor's ``sizevars`` does):

* correctness (``if size == 1``: broadcast): ``bool()`` of the SymBool. The graph's shape
  env answers from what it knows (a dynamic size is >= 2) and adds a guard only when it
  must; a guard added this way is reported with the graph.
* heuristics (run in parallel? which accumulator?): :func:`hint` or :func:`known_true`,
  which never add a guard.
* emitted source: :func:`source`, the size as a Python expression over its symbols
  (``s0``, ``s27``), which kernels then take as arguments.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import (
    free_symbols, is_concrete_int, optimization_hint, statically_known_true,
)

#: a size in the IR
Size = int | torch.SymInt

#: the functions size expressions call (:mod:`simaccel.codegen.size_lib`): integer
#: sizes, and the float functions of them a lifted int's uses compute
SIZE_FUNCTION_NAMES = ("FloorDiv", "CleanDiv", "Mod", "PythonMod", "ModularIndexing", "Max",
                       "Min", "ToFloat", "FloatTrueDiv", "IntTrueDiv", "FloatPow",
                       "OpaqueUnaryFn_sqrt")

#: a size symbol in emitted source: backed (``s``) and unbacked (``u``) symbols
SYMBOL_NAME = re.compile(r"\b[su]\d+\b")
#: a function call in emitted index source (a size function: not evaluated as plain ints)
CALL = re.compile(r"[A-Za-z_]\w*\s*\(")


def size(value: Any) -> Size:
    """``value`` as an IR size: a concrete SymInt becomes an int (no guard)."""
    if isinstance(value, torch.SymInt):
        return int(value) if is_concrete_int(value) else value
    return int(value)


def shape_of(values: Iterable[Any]) -> tuple[Size, ...]:
    return tuple(size(v) for v in values)


def is_symbolic(value: Any) -> bool:
    return isinstance(value, torch.SymInt) and not is_concrete_int(value)


def prod(values: Iterable[Size]) -> Size:
    """Product of sizes (1 for none), symbolic if any factor is."""
    return math.prod(values, start=1)


def hint(value: Size) -> int:
    """The size seen while tracing (for heuristics only: never adds a guard)."""
    return optimization_hint(value) if isinstance(value, torch.SymInt) else int(value)


def known_true(condition: Any) -> bool:
    """True if the shape env can prove ``condition`` for every size (never adds a guard)."""
    return bool(condition) if isinstance(condition, bool) else statically_known_true(condition)


def source(value: Size) -> str:
    """Python source of a size: ``"64"``, ``"s0"``, ``"(s0*s1)"`` (parenthesised unless
    atomic). Functions print by sympy's names (``Max``, ``Mod``), which kernels and the
    runtime both provide (:mod:`simaccel.codegen.size_lib`,
    :data:`simaccel.runtime.sizes.SIZE_FUNCTIONS`)."""
    if not is_symbolic(value):
        return str(int(value))
    text = str(value)
    return text if re.fullmatch(r"[su]\d+", text) else f"({text})"


def float_source(value: torch.SymFloat) -> str | None:
    """Python source of a float computed from sizes (``FloatTrueDiv(1.0, ToFloat(s0))``),
    or None when it names anything a kernel cannot evaluate (a float symbol, an
    unsupported function): then the caller specializes it."""
    text = str(value)
    names = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text))
    if names - set(SIZE_FUNCTION_NAMES) - set(re.findall(r"\bs\d+\b", text)):
        return None
    return f"({text})"


def symbol_names(value: Any) -> set[str]:
    """Names of the size symbols ``value`` depends on."""
    if isinstance(value, (torch.SymInt, torch.SymBool)):
        return {str(s) for s in free_symbols(value)}
    return set()


def names_in(text: str) -> list[str]:
    """Size symbols named in emitted source ``text``, in order of first appearance."""
    return list(dict.fromkeys(SYMBOL_NAME.findall(text)))


def smin(a: Size, b: Size) -> Size:
    """``min(a, b)``: plain for static sizes, else decided if the shape env knows the
    order, else a symbolic ``Min`` (never a guard)."""
    if not is_symbolic(a) and not is_symbolic(b):
        return min(a, b)
    if known_true(a <= b):
        return a
    if known_true(b <= a):
        return b
    return torch.sym_min(a, b)


def smax(a: Size, b: Size) -> Size:
    """``max(a, b)``, as :func:`smin`."""
    if not is_symbolic(a) and not is_symbolic(b):
        return max(a, b)
    if known_true(a >= b):
        return a
    if known_true(b >= a):
        return b
    return torch.sym_max(a, b)


def is_value(value: Size, constant: int) -> bool:
    """``value == constant`` for a static size; False for a symbolic one (no guard: a
    dynamic size is never taken for a constant)."""
    return not is_symbolic(value) and value == constant


def same_size(a: Size, b: Size) -> bool:
    """``a == b`` where the shape env can prove it (or both are static and equal); never
    adds a guard, so a layout decision taken on it holds for every size."""
    if not is_symbolic(a) and not is_symbolic(b):
        return a == b
    return known_true(a == b)

"""Symbolic sizes at call time.

A graph compiled for dynamic shapes names its sizes by symbols (``s0``, ``s27``...);
buffer sizes, output shapes and strides, and the size arguments of kernel launches are
integer expressions over them, written as Python source (``"s0*s27"``, ``"(s0//2)"``,
``"Max(s0, s1)"``). Each call reads the symbols' values from its arguments
(:class:`SymbolSource`) and evaluates the expressions once per distinct size tuple.

This module knows nothing of torch: an expression is a string, evaluated with the integer
functions below (the names sympy prints for them).
"""
from __future__ import annotations

import math
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

#: a size: a plain int, or an expression (Python source) over the program's symbols
Size = int | str


def _floor_div(a: int, b: int) -> int:
    return a // b


def _mod(a: int, b: int) -> int:
    return a % b


def _modular_indexing(x: int, div: int, mod: int) -> int:
    return (x // div) % mod


def _ceil_to_int(x: Any) -> int:
    return int(math.ceil(x))


def _floor_to_int(x: Any) -> int:
    return int(math.floor(x))


def _true_div(a: Any, b: Any) -> float:
    return float(a) / float(b)


def _to_float(a: Any) -> float:
    return float(a)


def _float_pow(a: Any, b: Any) -> float:
    return float(a) ** float(b)


def _sqrt(a: Any) -> float:
    return math.sqrt(a)


#: the functions size expressions may call, by the name sympy prints: integer sizes, and
#: the floats a graph computes from them (``1.0 / sym_float(p)``, ``sqrt(head_dim)``)
SIZE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "FloorDiv": _floor_div, "CleanDiv": _floor_div, "Mod": _mod, "PythonMod": _mod,
    "ModularIndexing": _modular_indexing, "Max": max, "Min": min,
    "CeilToInt": _ceil_to_int, "FloorToInt": _floor_to_int, "TruncToInt": int,
    "ToFloat": _to_float, "FloatTrueDiv": _true_div, "IntTrueDiv": _true_div,
    "FloatPow": _float_pow, "OpaqueUnaryFn_sqrt": _sqrt,
    # the relations of a runtime assertion on sizes (``Eq(u0, 3)``)
    "Eq": operator.eq, "Ne": operator.ne,
}


@dataclass(frozen=True)
class SymbolSource:
    """Where a call's value of ``symbol`` is read: argument ``index`` itself (an int), or
    ``dim`` of its shape (a tensor argument; ``dim`` counts from 0)."""

    symbol: str
    index: int
    dim: int | None = None

    def read(self, args: Sequence[Any]) -> int:
        value = args[self.index]
        return int(value if self.dim is None else value.shape[self.dim])


def size_reader(symbols: Sequence[SymbolSource]) -> Callable[[Sequence[Any]], tuple[int, ...]]:
    """A call's values of ``symbols`` from its arguments, in order: the same numbers as
    ``tuple(src.read(args) for src in symbols)``. This runs on every call of a program
    with size symbols, so where every symbol is an argument itself (lifted ints, no
    tensor dim) it is one C-level ``itemgetter`` (~0.5 us less per call)."""
    symbols = tuple(symbols)
    if not symbols or any(src.dim is not None for src in symbols):
        return lambda args: tuple(src.read(args) for src in symbols)
    if len(symbols) == 1:  # one lifted int: the common case
        index = symbols[0].index
        return lambda args: (int(args[index]),)
    get = tuple_getter([src.index for src in symbols])
    return lambda args: tuple(map(int, get(args)))


def tuple_getter(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple]:
    """``args -> tuple(args[i] for i in indices)`` as one C-level ``itemgetter`` call
    (per-call paths: a program's size symbols, its constant-bank values)."""
    if len(indices) == 1:
        index = indices[0]
        return lambda args: (args[index],)
    if not indices:
        return lambda args: ()
    return operator.itemgetter(*indices)


class SizeFunction:
    """Evaluates a fixed list of sizes from the symbols' values: ``fn(values) -> ints``.

    ``symbols`` fixes the order of ``values``; ``sizes`` are ints or expressions over
    them. Compiled once into one Python function (a lambda over the symbols)."""

    def __init__(self, symbols: Sequence[str], sizes: Sequence[Size]):
        self.symbols = tuple(symbols)
        self.sizes = tuple(sizes)
        args = ", ".join(self.symbols)
        body = ", ".join(str(s) for s in self.sizes)
        source = f"lambda {args}: ({body}{',' if len(self.sizes) == 1 else ''})"
        self._fn = eval(compile(source, "<simaccel sizes>", "eval"),  # noqa: S307
                        dict(SIZE_FUNCTIONS))
        names = set(re.findall(r"[A-Za-z_]\w*", body))
        #: positions (in ``symbols``) of the symbols some size reads: the others change
        #: no result, so a cache of results may key on these alone (:meth:`key`)
        self._used_positions = tuple(i for i, s in enumerate(self.symbols) if s in names)
        self._every_symbol_used = len(self._used_positions) == len(self.symbols)

    def key(self, values: tuple[int, ...]) -> tuple[int, ...]:
        """The values of the used symbols: calls with the same key get the same sizes."""
        if self._every_symbol_used:
            return values
        if not self._used_positions:  # ints only kernels read (runs on every call)
            return ()
        return tuple(values[i] for i in self._used_positions)

    def __call__(self, values: Sequence[int]) -> tuple[int, ...]:
        return tuple(map(int, self._fn(*values)))


def is_static(size: Size) -> bool:
    return isinstance(size, int)

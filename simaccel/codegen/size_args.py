"""Dynamic sizes from the IR to the runtime: kernel size arguments and size expressions.

A kernel whose source names size symbols (``for i0 in range(s0):``) reads them from the
program's size bank in device memory (part of the constant bank: the runtime uploads the
symbols' values there, once per size change), renamed by position (``_z0, _z1``, loaded
from bank slots given as arguments) so that kernels of the same structure share one
source, one numba compile and one cache entry, whatever the symbols are called and
whatever their values. Everything else symbolic (buffer sizes, template
parameters, output layouts, costs) reaches the runtime as an expression string
(:mod:`simaccel.runtime.sizes`); each symbol's value is read from the call's arguments
(:class:`~simaccel.runtime.sizes.SymbolSource`).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from simaccel.codegen.sizes import SYMBOL_NAME, hint, is_symbolic, names_in
from simaccel.errors import UnsupportedOpError
from simaccel.runtime.sizes import SIZE_FUNCTIONS, SymbolSource

_DEF_LINE = re.compile(r"def kernel\((.*?)\):")


def with_size_args(source: str, buffers: int,
                   symbols: list[str] | None = None) -> tuple[str, list[str]]:
    """``source`` whose ``kernel`` also reads the size symbols it names from the size bank,
    and those symbols in slot order. The kernel takes the bank (an int64 array) after its
    ``buffers`` array arguments and one slot index per symbol at the end, and loads the
    values first (``_z0 = _zb[_zs0]``), so kernels of the same structure share one source,
    one numba compile and one cache entry, whatever the symbols are called, wherever the
    program keeps them and whatever their values."""
    symbols = names_in(source)
    if not symbols:
        return source, []
    position = {name: f"_z{k}" for k, name in enumerate(symbols)}
    renamed = SYMBOL_NAME.sub(lambda m: position[m.group(0)], source)
    slots = ", ".join(f"_zs{k}" for k in range(len(symbols)))
    loads = "".join(f"\n    _z{k} = _zb[_zs{k}]" for k in range(len(symbols)))

    def signature(match: re.Match) -> str:
        args = [a.strip() for a in match.group(1).split(",") if a.strip()]
        args = args[:buffers] + ["_zb"] + args[buffers:]
        return f"def kernel({', '.join(args)}, {slots}):{loads}"
    return _DEF_LINE.sub(signature, renamed, 1), symbols


def runtime_size(value: Any) -> Any:
    """An IR size (or cost) for the runtime: a number, or a dynamic one as an expression
    string over its symbols."""
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        if isinstance(value, torch.SymFloat) or is_symbolic(value):
            return str(value)
        return int(value)
    return value


def evaluate_size(value: Any, sizes: Mapping[str, int]) -> Any:
    """A SymInt/SymFloat's value at a call whose size symbols are ``sizes``."""
    text = runtime_size(value)
    if not isinstance(text, str):
        return text
    code = _COMPILED.get(text)
    if code is None:
        code = _COMPILED[text] = compile(text, "<simaccel size>", "eval")
    return eval(code, dict(SIZE_FUNCTIONS), dict(sizes))  # noqa: S307 - our own printing


#: compiled size expressions (host ops evaluate theirs at each call)
_COMPILED: dict[str, Any] = {}


def runtime_sizes(values: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(runtime_size(v) for v in values)


def symbol_sources(inputs: Iterable[Any], needed: Iterable[str]
                   ) -> tuple[tuple[SymbolSource, ...], tuple[int, ...]]:
    """Where each needed symbol's value is read at call time (an int input that is that
    symbol, else a tensor input dim of that size), and its value while tracing.
    ``inputs``: the lowered graph's ``InputSpec`` records (their ``value`` is the
    placeholder's example value)."""
    found: dict[str, SymbolSource] = {}
    traced: dict[str, int] = {}
    tensors = []
    for spec in inputs:
        value = spec.value
        if isinstance(value, torch.SymInt) and SYMBOL_NAME.fullmatch(str(value)):
            found.setdefault(str(value), SymbolSource(str(value), spec.index))
            traced.setdefault(str(value), hint(value))
        elif isinstance(value, torch.Tensor):
            tensors.append(spec)
    for spec in tensors:
        for dim, n in enumerate(spec.value.shape):
            if is_symbolic(n) and SYMBOL_NAME.fullmatch(str(n)):
                found.setdefault(str(n), SymbolSource(str(n), spec.index, dim))
                traced.setdefault(str(n), hint(n))
    missing = [name for name in dict.fromkeys(needed) if name not in found]
    if missing:
        raise UnsupportedOpError(
            "dynamic size", f"no graph input carries the value of {missing} (a size only a "
            f"device computation produces); mark the input static or use dynamic=False")
    names = list(dict.fromkeys(needed))
    return tuple(found[n] for n in names), tuple(traced[n] for n in names)


def names_of(values: Iterable[Any]) -> list[str]:
    """Size symbols named by runtime sizes (expression strings), in first-seen order."""
    names: list[str] = []
    for value in values:
        if isinstance(value, str):
            names += names_in(value)
    return list(dict.fromkeys(names))

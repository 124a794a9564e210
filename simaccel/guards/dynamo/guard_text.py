"""The frame's guards as readable text, the way ``TORCH_LOGS=guards`` prints them.

Dynamo guards (``TYPE_MATCH: type(L['a']) is float``) and shape-env predicates on a lifted
scalar's symbol, written with source names instead of symbols (``L['alpha'] > 0.0``).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from simaccel.guards.dynamo.frame import VALUE_GUARDS, output_graph, source_value


def readable_guards(sources: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Guards of the frame on each source, readable (``TYPE_MATCH: type(L['a']) is float``).

    Shape-env predicates on a lifted scalar's symbol are included, written with source names
    (``L['alpha'] > 0.0``), the way ``TORCH_LOGS=guards`` prints them.
    """
    out = output_graph()
    wanted = set(sources)
    result: dict[str, list[str]] = {name: [] for name in wanted}
    for guard in sorted(out.guards, key=lambda g: (g.name, g.create_fn_name())):
        if guard.name in wanted:
            result[guard.name].append(_guard_text(out, guard))
    for name, predicates in symbol_predicates(wanted).items():
        result[name].extend(predicates)
    for name in _float_symbol_sources(wanted):
        result[name].append(f"not math.isnan({name})")
    return {name: tuple(dict.fromkeys(lines)) for name, lines in result.items()}


def symbol_predicates(sources: Iterable[str]) -> dict[str, list[str]]:
    """Shape-env guards that mention each source's symbol, as readable text."""
    symbols = source_symbols()
    shape_env = output_graph().shape_env
    result: dict[str, list[str]] = {}
    for name in sources:
        symbol = symbols.get(name)
        if symbol is None:
            continue
        result[name] = [_symbol_text(g.expr) for g in shape_env.guards
                        if symbol in g.expr.free_symbols]
    return result


def source_symbols() -> dict[str, Any]:
    """Source name -> the sympy symbol the shape env created for it."""
    names: dict[str, Any] = {}
    for symbol, sources in output_graph().shape_env.var_to_sources.items():
        for source in sources:
            names.setdefault(source.name, symbol)
    return names


def _float_symbol_sources(sources: Iterable[str]) -> list[str]:
    """Sources whose value is a float symbol of the shape env: Dynamo guards each one with
    ``not math.isnan(...)`` (``ShapeEnv.produce_guards``: the shape env reasons as if the
    float were a real number, see :func:`simaccel.guards.dynamo.install.SIMACCEL_SHAPE_ENV`)."""
    from torch.utils._sympy.symbol import SymT, symbol_is_type
    symbols = source_symbols()
    ranges = output_graph().shape_env.var_to_range
    return [name for name in sources
            if (symbol := symbols.get(name)) is not None and symbol in ranges
            and symbol_is_type(symbol, SymT.FLOAT)]


def _guard_text(out: Any, guard: Any) -> str:
    kind_name = guard.create_fn_name()
    try:
        value = source_value(out, guard.originating_source)
    except Exception:  # noqa: BLE001 - text only
        return f"{kind_name}: {guard.name}"
    if kind_name in VALUE_GUARDS:
        return f"{kind_name}: {guard.name} == {value!r}"
    if kind_name == "TYPE_MATCH":
        return f"{kind_name}: type({guard.name}) is {type(value).__name__}"
    return f"{kind_name}: {guard.name}"


def _symbol_text(expr: Any) -> str:
    """``expr`` with each symbol replaced by its source name (``zf3 > 0`` -> ``L['a'] > 0``)."""
    import sympy
    shape_env = output_graph().shape_env
    subs = {s: sympy.Symbol(shape_env.var_to_sources[s][0].name)
            for s in expr.free_symbols if shape_env.var_to_sources.get(s)}
    return str(expr.xreplace(subs))

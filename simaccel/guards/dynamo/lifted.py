"""What a re-traced graph made of the scalars simaccel asked Dynamo to lift.

A requested source can come out as a graph input, as a symbol only a predicate guard uses,
as part of a tensor shape, pinned to its value again, or still value-guarded
(:class:`~simaccel.guards.records.LiftOutcome`).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from simaccel.guards.dynamo.frame import (
    VALUE_GUARDS, output_graph, placeholders_by_source, source_value, where,
)
from simaccel.guards.dynamo.guard_text import source_symbols, symbol_predicates
from simaccel.guards.records import LiftOutcome, ScalarSite, value_kind


def inspect_lifted(gm: torch.fx.GraphModule, sources: Iterable[str]) -> dict[str, LiftOutcome]:
    """Classify how each of ``sources`` appears in the re-traced graph ``gm``."""
    out = output_graph()
    sources = list(sources)
    symbols = source_symbols()
    placeholders = placeholders_by_source(gm)
    shape_symbols = _tensor_shape_symbols(gm)
    value_guarded = {g.name for g in out.guards if g.create_fn_name() in VALUE_GUARDS}
    predicates = symbol_predicates(sources)
    outcomes = {}
    for name in sources:
        index, node = placeholders.get(name, (None, None))
        symbol = symbols.get(name)
        replaced = out.shape_env.replacements.get(symbol) if symbol is not None else None
        status = ("not_lifted" if name in value_guarded or (symbol is None and node is None)
                  else "specialized" if replaced is not None and replaced.is_number
                  else "shape" if symbol in shape_symbols
                  else "input" if node is not None else "guard_only")
        outcomes[name] = LiftOutcome(
            name, status, node.name if node is not None else None, index,
            node.meta.get("example_value") if node is not None else None,
            tuple(predicates.get(name, ())))
    return outcomes


def scalar_inputs(gm: torch.fx.GraphModule) -> list[tuple[ScalarSite, LiftOutcome]]:
    """Every Python-scalar graph input of ``gm`` (lifted by simaccel or by Dynamo itself).

    Tensor size symbols (``L['x'].size()[0]`` under ``dynamic=True``) are not included.
    """
    from torch._dynamo.source import TensorPropertySource
    out = output_graph()
    found = []
    placeholders = placeholders_by_source(gm)
    predicates = symbol_predicates(placeholders)
    for name, (index, node) in placeholders.items():
        grapharg = node.meta["grapharg"]
        if grapharg.is_tensor or isinstance(grapharg.source, TensorPropertySource):
            continue
        try:
            value = source_value(out, grapharg.source)
        except Exception:  # noqa: BLE001 - fall back to the traced example
            value = grapharg.example
        site = ScalarSite(name, value, value_kind(value), where(out, grapharg.source), "")
        found.append((site, LiftOutcome(name, "input", node.name, index,
                                        node.meta.get("example_value"),
                                        tuple(predicates.get(name, ())))))
    return found


def _tensor_shape_symbols(gm: torch.fx.GraphModule) -> set[Any]:
    """Symbols that occur in the size/stride of any tensor the graph produces or takes."""
    from torch.fx.experimental.symbolic_shapes import free_symbols
    found: set[Any] = set()
    for node in gm.graph.nodes:
        for leaf in pytree.tree_leaves(node.meta.get("example_value")):
            if isinstance(leaf, torch.Tensor):
                found |= free_symbols(leaf)
    return found

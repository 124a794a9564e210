"""Graph outputs that are views of graph inputs: made on the host, never computed.

A training graph's forward saves ``t(weight)`` for its backward, and the input ``x``
itself; an inference graph may return ``x.transpose(0, 1)``. Computing such a view on
the device means a kernel copying the input and a device-to-host transfer of the copy
(the 4 MB of a 512x2048 weight per step), where eager (and AOTAutograd's own runtime)
hands out a view of the input. These outputs are replayed on the caller's tensor
instead: the same view ops with the same arguments, so the result aliases the input as
in eager.

An output qualifies when it is a chain of view ops (:data:`VIEW_OPS`; none for an input
returned as it is) from a tensor placeholder whose arguments are all concrete (no size
symbol, no other node), and the graph does not write the placeholder back (an input
mutation would change what the view shows after the call). An input returned as it is
has no device output at all, so the call's download is the plain one a replay repeats.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx

aten = torch.ops.aten

#: ops whose result is a view of their first argument, replayed as they are
VIEW_OPS = frozenset({
    aten.t.default, aten.permute.default, aten.transpose.int, aten.view.default,
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
    aten.expand.default, aten.alias.default, aten.slice.Tensor, aten.select.int,
    aten.detach.default, aten.as_strided.default, aten.diagonal.default,
})


def _concrete(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_concrete(v) for v in value)
    return not isinstance(value, (torch.fx.Node, torch.SymInt, torch.SymFloat,
                                  torch.SymBool))


def _written_back(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """Placeholders the graph mutates (AOTAutograd's ``copy_(input, new)``)."""
    return {n.args[0] for n in gm.graph.nodes
            if n.op == "call_function" and n.target is aten.copy_.default}


def _chain(node: Any, placeholders: dict[torch.fx.Node, int], mutated: set
           ) -> tuple[int, list[tuple[Any, tuple, dict]]] | None:
    """(placeholder position, view ops from it to ``node``) or None."""
    ops: list[tuple[Any, tuple, dict]] = []
    while isinstance(node, torch.fx.Node) and node.op == "call_function" \
            and node.target in VIEW_OPS and node.args:
        rest = node.args[1:]
        if not _concrete(rest) or not _concrete(tuple(node.kwargs.values())):
            return None
        ops.append((node.target, rest, dict(node.kwargs)))
        node = node.args[0]
    if node not in placeholders or node in mutated:
        return None
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return None
    return placeholders[node], list(reversed(ops))


def input_view_outputs(gm: torch.fx.GraphModule
                       ) -> dict[int, Callable[[list[Any]], torch.Tensor]]:
    """Output position -> ``(args) -> the view`` for each output that is a view of an
    input (see the module doc)."""
    placeholders = {n: k for k, n in enumerate(n for n in gm.graph.nodes
                                                if n.op == "placeholder")}
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    mutated = _written_back(gm)
    found: dict[int, Callable[[list[Any]], torch.Tensor]] = {}
    for index, node in enumerate(flat):
        chain = _chain(node, placeholders, mutated)
        if chain is not None:
            found[index] = _replay(*chain)
    return found


def _replay(position: int, ops: list[tuple[Any, tuple, dict]]
            ) -> Callable[[list[Any]], torch.Tensor]:
    def view(args: list[Any]) -> torch.Tensor:
        value = args[position]
        for op, rest, kwargs in ops:
            value = op(value, *rest, **kwargs)
        return value
    return view

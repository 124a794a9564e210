"""AOTAutograd's tensorify pass, without the specializations simaccel does not need.

A lifted float reaches AOTAutograd as a 0-d float64 graph input read with ``.item()`` (a
backed SymFloat). AOTAutograd's ``tensorify_python_scalars`` pass
(``torch/fx/passes/_tensorify_python_scalars.py``) rewrites the few ops it knows
(``mul``/``add``/``sub``/``div``/``pow`` and comparisons, positional arguments only) into
tensor ops on that input, and *specializes every other use*: ``add(x, y, alpha=-lr)``
(SGD), ``clamp(x, min=lo)``, ``pow(x, p)``, ``full(size, v)``, ``lerp(a, b, w)`` and
every keyword argument. The specialization is a value guard plus a restart of Dynamo's
analysis, and after a change of the value a recompile, on every change.

simaccel's lowering reads such scalars from the constant bank (and host fallbacks get the
call's Python number), so :func:`simaccel_tensorify` keeps them symbolic. Before the pass
it *shields* each use the pass would specialize: the argument ``s`` (a SymFloat
expression of lifted floats) is replaced by a 0-d float64 tensor ``mul(1.0, s)``, which
the pass does rewrite into tensor ops on the graph inputs (and so counts ``s``'s symbols
as tensorified: no restart). After the pass, ``_local_scalar_dense`` of that tensor takes
the argument's place again, with ``s`` as its metadata value. ``1.0 * s`` is exact for
every float (signed zeros, infinities and NaN included).

A float that ends up in a tensor *shape* is left to the pass, which specializes it as
before: static shapes need its value. A float the graph does not use, or one Dynamo
already pinned to its value, needs no restart of Dynamo's analysis either
(:func:`_spare_restarts`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

aten = torch.ops.aten


@dataclass
class _Shield:
    """One shielded argument: ``user``'s argument at ``path`` was the SymFloat node
    ``value`` (metadata ``sym``); during the pass it is the 0-d tensor ``tensor``."""

    user: torch.fx.Node
    path: tuple[Any, ...]
    sym: Any


def _is_backed_float(value: Any) -> bool:
    """A SymFloat over backed float symbols only (what the pass would specialize)."""
    from torch.utils._sympy.symbol import SymT, symbol_is_type
    if not isinstance(value, torch.SymFloat):
        return False
    symbols = value.node.expr.free_symbols
    return bool(symbols) and all(symbol_is_type(s, SymT.FLOAT) for s in symbols)


def _is_scalar_node(node: torch.fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (torch.SymFloat, torch.SymInt, torch.SymBool))


def _stuck_uses(graph: torch.fx.Graph, supported: Any) -> list[tuple[torch.fx.Node, tuple]]:
    """(user, path) of every SymFloat argument the pass would specialize: any keyword
    argument, and the positional ones of ops it does not rewrite. Scalar arithmetic
    (nodes whose value is itself a SymFloat/SymInt) is left to the pass: it folds those
    into the expression of the use."""
    found = []
    for node in graph.nodes:
        if node.op != "call_function" or _is_scalar_node(node):
            continue
        if node.target is aten._local_scalar_dense.default:
            continue
        positional = node.target not in supported
        for path, value in _argument_paths(node):
            if path[0] == "args" and not positional:
                continue
            if isinstance(value, torch.fx.Node) and _is_backed_float(value.meta.get("val")):
                found.append((node, path))
    return found


def _argument_paths(node: torch.fx.Node) -> Iterator[tuple[tuple, Any]]:
    """((\"args\"|\"kwargs\", key, [index in a list]), value) of each argument leaf."""
    for where, container in (("args", enumerate(node.args)), ("kwargs", node.kwargs.items())):
        for key, value in container:
            if isinstance(value, (list, tuple)):
                for k, item in enumerate(value):
                    yield (where, key, k), item
            else:
                yield (where, key), value


def _get(node: torch.fx.Node, path: tuple) -> Any:
    value = (node.args if path[0] == "args" else node.kwargs)[path[1]]
    return value[path[2]] if len(path) > 2 else value


def _set(node: torch.fx.Node, path: tuple, new: Any) -> None:
    where, key = path[0], path[1]
    container = list(node.args) if where == "args" else dict(node.kwargs)
    if len(path) > 2:
        items = list(container[key])
        items[path[2]] = new
        container[key] = type(node.args[key] if where == "args" else node.kwargs[key])(items)
    else:
        container[key] = new
    if where == "args":
        node.args = tuple(container)
    else:
        node.kwargs = container


def _shield(graph: torch.fx.Graph, fake_mode: Any, supported: Any) -> list[_Shield]:
    """Replace each stuck SymFloat argument by ``mul(1.0, s)`` (a 0-d float64 tensor)."""
    shields = []
    tensors: dict[torch.fx.Node, torch.fx.Node] = {}
    for user, path in _stuck_uses(graph, supported):
        value = _get(user, path)
        if value not in tensors:
            with graph.inserting_after(value):
                one = graph.call_function(aten.scalar_tensor.default, (1.0,),
                                          {"dtype": torch.float64})
            with graph.inserting_after(one):
                tensor = graph.call_function(aten.mul.Tensor, (one, value))
            with fake_mode:
                one.meta["val"] = torch.ops.aten.scalar_tensor.default(1.0,
                                                                       dtype=torch.float64)
                tensor.meta["val"] = torch.empty((), dtype=torch.float64)
            tensors[value] = tensor
        shields.append(_Shield(user, path, value.meta["val"]))
        _set(user, path, tensors[value])
    return shields


def _unshield(graph: torch.fx.Graph, shields: list[_Shield]) -> None:
    """Put a ``_local_scalar_dense`` of each (now tensorified) shield back in place."""
    scalars: dict[torch.fx.Node, torch.fx.Node] = {}
    for shield in shields:
        tensor = _get(shield.user, shield.path)
        if tensor not in scalars:
            with graph.inserting_after(tensor):
                item = graph.call_function(aten._local_scalar_dense.default, (tensor,))
            item.meta["val"] = shield.sym
            scalars[tensor] = item
        _set(shield.user, shield.path, scalars[tensor])


def _used_symbols(graph: torch.fx.Graph) -> set[Any]:
    """Symbols in the value of any node that is used (or a tensor, whose shape counts)."""
    from torch.fx.experimental.symbolic_shapes import free_symbols
    used: set[Any] = set()
    for node in graph.nodes:
        if node.op == "output" or (not node.users and not isinstance(
                node.meta.get("val"), torch.Tensor)):
            continue
        used |= free_symbols(node.meta.get("val"))
    return used


def _spare_restarts(graph: torch.fx.Graph, shape_env: Any) -> set[str]:
    """Float symbols the pass would restart Dynamo's analysis for although the graph is
    right as it is: pinned to a number already (``layer_norm``'s ``eps``, a ``double``
    argument) or unused (a float only a branch compares). The restart would only drop
    their unused graph input, at the cost of one more trace. They are marked as
    specialized for the pass (``TensorifyState``), which then leaves them; returns the
    names marked, to unmark after the pass."""
    from torch._dynamo.symbolic_convert import TensorifyState
    from torch.utils._sympy.symbol import SymT, symbol_is_type
    used = _used_symbols(graph)
    spared = set()
    for symbol in shape_env.backed_var_to_val:
        name = str(symbol)
        if not symbol_is_type(symbol, SymT.FLOAT) or TensorifyState.should_specialize(name):
            continue
        replaced = shape_env.replacements.get(symbol)
        if (replaced is not None and replaced.is_number) or symbol not in used:
            spared.add(name)
    TensorifyState.force_specializations.update(spared)
    return spared


def simaccel_tensorify(original: Callable[..., None]) -> Callable[..., None]:
    """``original`` (the pass), with the uses simaccel lowers itself kept symbolic."""
    from torch.fx.passes import _tensorify_python_scalars as pass_module

    def run(gm: torch.fx.GraphModule, shape_env: Any, fake_mode: Any) -> None:
        shields = _shield(gm.graph, fake_mode, pass_module.SUPPORTED_OPS)
        spared = _spare_restarts(gm.graph, shape_env)
        try:
            original(gm, shape_env, fake_mode)  # may raise the restart: gm is dropped then
        finally:
            pass_module.TensorifyState.force_specializations.difference_update(spared)
        if shields:
            _unshield(gm.graph, shields)
            gm.recompile()
    return run


@contextlib.contextmanager
def symbolic_scalar_arguments() -> Iterator[None]:
    """While AOTAutograd runs for simaccel: its tensorify pass keeps the scalar arguments
    simaccel lowers itself symbolic (see the module docstring)."""
    from torch._functorch._aot_autograd import graph_compile
    original = graph_compile.tensorify_python_scalars
    graph_compile.tensorify_python_scalars = simaccel_tensorify(original)
    try:
        yield
    finally:
        graph_compile.tensorify_python_scalars = original

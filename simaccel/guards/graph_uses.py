"""What the first trace's graph does with each baked scalar, decided before any re-trace.

On a frame's first trace Dynamo has baked every scalar it read into the FX graph as a
constant. Where a value lands tells what lifting it would give:

* ``value``: an operand of arithmetic (``x * 0.125``, ``alpha=-0.01``, ``full(s, 0.5)``):
  lift it, a new value then costs no recompile.
* ``shape``: only sizes, dims, indices and slices (``view(2, 4, 4)``, ``sum(dim=-1)``,
  ``y[:2]``): lifting it would make shapes symbolic; Dynamo would pin it again.
* ``hyperparameter``: only parameters ATen takes as ``double`` (``layer_norm`` ``eps``,
  ``batch_norm`` ``momentum``, ``dropout`` ``p``): Dynamo specializes it on use.
* ``absent``: nowhere in the graph. It only steers Python control flow, bounds a loop,
  slices a Python list (``self.layers[:n]``), is read and unused, or Dynamo folded it
  into another constant (``b * n`` of two baked scalars): :mod:`simaccel.guards.lift`
  decides by where it lives.

A source is matched by value: ``v`` or ``-v`` (``add_(g, alpha=-lr)``), of its own kind
(a float matches float constants, an int int constants, never a bool). A coincidence
(another constant with the same value) can only make a source a candidate: that costs at
most the re-trace that finds out, never a recompile.

Pure FX: no Dynamo internals.
"""
from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Iterable, Iterator
from typing import Any

import torch.fx

VALUE, SHAPE, HYPERPARAMETER, ABSENT = "value", "shape", "hyperparameter", "absent"

#: ops whose int arguments are sizes, dims or indices (by function or method name)
_SHAPE_OPS = frozenset({
    "view", "reshape", "expand", "repeat", "tile", "permute", "transpose", "swapaxes",
    "flatten", "unflatten", "squeeze", "unsqueeze", "size", "stride", "split",
    "split_with_sizes", "chunk", "narrow", "select", "movedim", "moveaxis", "roll", "flip",
    "zeros", "ones", "empty", "rand", "randn", "randint", "arange", "new_zeros", "new_ones",
    "new_empty", "getitem", "cat", "concat", "stack", "softmax", "log_softmax", "sum",
    "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "var", "std",
    "logsumexp", "cumsum", "cumprod", "topk", "sort", "argsort", "gather", "scatter",
    "index_select", "tril", "triu", "pad", "interpolate", "unfold", "diagonal", "norm",
    "layer_norm", "group_norm", "conv1d", "conv2d", "conv3d", "max_pool2d", "avg_pool2d",
    "adaptive_avg_pool2d", "embedding", "one_hot",
})
#: (op name, argument) pairs whose value is an operand even in a shape op
_VALUE_ARGS = frozenset({("full", 1), ("full", "fill_value"), ("new_full", 2),
                         ("new_full", "fill_value"), ("norm", "p"), ("norm", 1)})
#: argument names ATen takes as ``double`` constants (Dynamo specializes them)
_HYPERPARAMETER_ARGS = frozenset({"eps", "momentum"})
_DROPOUT_OPS = frozenset({"dropout", "alpha_dropout", "feature_alpha_dropout",
                          "dropout1d", "dropout2d", "dropout3d"})


def _op_name(node: torch.fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    if node.target is operator.getitem:
        return "getitem"
    return getattr(node.target, "__name__", str(node.target)).lstrip("_")


def _parameter_names(node: torch.fx.Node) -> list[str]:
    """Names of the positional parameters of a Python-level target (``F.layer_norm``),
    ``[]`` for builtins and methods."""
    if node.op != "call_function":
        return []
    try:
        return list(inspect.signature(node.target).parameters)
    except (TypeError, ValueError):
        return []


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, slice):
        yield from _leaves((value.start, value.stop, value.step))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


def _arguments(node: torch.fx.Node) -> Iterator[tuple[Any, Any, Any]]:
    """(position, name or None, scalar constant) of every number in ``node``'s args."""
    names = _parameter_names(node)
    args = node.args[1:] if node.op == "call_method" else node.args
    for k, arg in enumerate(args):
        name = names[k] if k < len(names) else None
        for leaf in _leaves(arg):
            yield k, name, leaf
    for name, arg in node.kwargs.items():
        for leaf in _leaves(arg):
            yield None, name, leaf


def _use_kind(op: str, position: Any, name: Any, constant: Any) -> str:
    if isinstance(constant, float):
        if name in _HYPERPARAMETER_ARGS or (name == "p" and op in _DROPOUT_OPS) \
                or (position == 1 and name is None and op in _DROPOUT_OPS):
            return HYPERPARAMETER
        if op == "interpolate" and name == "scale_factor":
            return SHAPE
        return VALUE
    if op in _SHAPE_OPS and (op, position) not in _VALUE_ARGS \
            and (op, name) not in _VALUE_ARGS:
        return SHAPE
    return VALUE


def constant_uses(gm: torch.fx.GraphModule) -> dict[tuple[type, Any], set[str]]:
    """(type, value) of every number constant in the graph -> the kinds of its uses."""
    uses: dict[tuple[type, Any], set[str]] = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        op = _op_name(node)
        for position, name, constant in _arguments(node):
            if isinstance(constant, float) and math.isnan(constant):
                continue
            kind = _use_kind(op, position, name, constant)
            uses.setdefault((type(constant), constant), set()).add(kind)
    return uses


def predict_uses(gm: torch.fx.GraphModule, values: Iterable[tuple[str, Any]]
                 ) -> dict[str, str]:
    """For each ``(source, value)``: ``value``, ``shape``, ``hyperparameter`` or ``absent``
    (see the module docstring)."""
    uses = constant_uses(gm)
    predicted = {}
    for source, value in values:
        kinds: set[str] = set()
        for candidate in {value, -value}:
            kinds |= uses.get((type(value), candidate), set())
        predicted[source] = (VALUE if VALUE in kinds else SHAPE if SHAPE in kinds
                             else HYPERPARAMETER if kinds else ABSENT)
    return predicted

"""``aten.native_layer_norm``: decomposed after AOTAutograd, where tracing is cheap.

simaccel lowers a layer norm from the graph torch's own decomposition
(``torch._refs.native_layer_norm``) makes: ``prims.var`` and ``prims.sum`` over the
normalised dimensions, each broadcast back, the sum divided by the element count, then
``rsqrt(var + eps)`` and the pointwise normalisation, scale and shift (with conversions to
float32 and back for half inputs): 11 nodes. AOTAutograd spends ~0.7 ms on every node it
traces (functionalization, proxies, fake tensors), ~7 ms a layer norm, ~0.1 s of a
6-layer GPT-2's cold first call. A graph AOTAutograd traces with the layer norm kept whole
(:func:`defers_layer_norm`) gets it expanded afterwards (:func:`expand_layer_norms`): the
same nodes, made by running :func:`native_layer_norm` on the first layer norm's fake
values and recording each op it dispatches, then replayed for every layer norm of the
same signature (~15 ms for GPT-2's 13, the ``decompose`` phase of a compile).
``tests/codegen/test_layer_norm_decomposition.py`` checks the graphs are equal.
"""
from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx
from torch._prims_common import is_contiguous_for_memory_format_or_false
from torch.fx.experimental.symbolic_shapes import is_concrete_int, sym_eq
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from simaccel.guards.dynamo import fake_value

aten = torch.ops.aten
prims = torch.ops.prims

#: input dtype -> the dtype the statistics are computed in (torch's computation dtype)
_COMPUTATION_DTYPE = {torch.float16: torch.float32, torch.bfloat16: torch.float32,
                      torch.float32: torch.float32, torch.float64: torch.float64}
#: Dynamo graph targets that reach ``aten.native_layer_norm``
_LAYER_NORM_CALLS = (torch.nn.functional.layer_norm, torch.layer_norm, torch.native_layer_norm,
                     aten.layer_norm.default, aten.native_layer_norm.default)


def _contiguous_or_false(t: torch.Tensor) -> bool:
    """Row-major contiguous, False where a symbolic size leaves it undecided."""
    return is_contiguous_for_memory_format_or_false(t, memory_format=torch.contiguous_format)


def _on_common_path(x: torch.Tensor, normalized_shape: Any, weight: Any, bias: Any) -> bool:
    """Whether :func:`native_layer_norm` builds the graph itself (else torch's reference)."""
    if x.dtype not in _COMPUTATION_DTYPE or len(normalized_shape) < 1:
        return False
    if not all(is_concrete_int(s) for s in normalized_shape):
        return False
    # the reference's own test: it clones an operand this says False for
    return all(_contiguous_or_false(t) for t in (x, weight, bias) if t is not None)


def _check_shapes(x: torch.Tensor, normalized_shape: Any, weight: Any, bias: Any) -> None:
    """The reference's shape checks (``torch._check``: a runtime assert where symbolic)."""
    shape = tuple(normalized_shape)
    for name, t in (("weight", weight), ("bias", bias)):
        torch._check(t is None or sym_eq(t.shape, shape),
                     lambda name=name, t=t: f"Expected {name} to be of same shape as "
                     f"normalized_shape, but got {name} of shape {t.shape} and "
                     f"normalized_shape = {normalized_shape}")
    torch._check(x.ndim >= len(shape) and sym_eq(x.shape[x.ndim - len(shape):], shape),
                 lambda: f"Given normalized_shape={normalized_shape}, expected input with "
                 f"shape {normalized_shape}, but got input of size {x.shape}")


def _to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``: a conversion node only when it differs (the reference's
    ``_maybe_convert_to_dtype``, whose ``prims.convert_element_type`` reaches the graph
    as ``_to_copy``)."""
    return t if t.dtype == dtype else aten._to_copy.default(t, dtype=dtype)


def native_layer_norm(x: torch.Tensor, normalized_shape: Any, weight: Any, bias: Any,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, mean, rstd)`` of a layer norm over the last ``len(normalized_shape)``
    dimensions, as ``torch._refs.native_layer_norm`` computes and traces them."""
    if not _on_common_path(x, normalized_shape, weight, bias):
        return torch._refs.native_layer_norm(x, normalized_shape, weight, bias, eps)
    _check_shapes(x, normalized_shape, weight, bias)
    dims = list(range(x.ndim - len(normalized_shape), x.ndim))
    kept = [i for i in range(x.ndim) if i not in dims]
    stat_shape = [1 if i in dims else x.shape[i] for i in range(x.ndim)]
    acc = _to(x, _COMPUTATION_DTYPE[x.dtype])
    var = prims.broadcast_in_dim(prims.var(acc, dims, 0.0), stat_shape, kept)
    total = prims.broadcast_in_dim(prims.sum(acc, dims), stat_shape, kept)
    mean = prims.div(total, float(math.prod(normalized_shape)))
    rstd = torch.rsqrt(var + eps)
    out = (acc - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    out = _to(out, x.dtype)
    if x.device.type in ("cpu", "mtia"):
        mean, rstd = _to(mean, x.dtype), _to(rstd, x.dtype)
    return out, mean, rstd


# --------------------------------------------------------------------------- deferring


def defers_layer_norm(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> bool:
    """Whether AOTAutograd should keep ``aten.native_layer_norm`` whole in this Dynamo
    graph, for :func:`expand_layer_norms` to decompose: every input of static shape (a
    symbolic size would need its own nodes in the expansion) and no layer norm whose
    ``eps`` or shape is symbolic (a lifted float must stay a tensor operand that
    AOTAutograd's tensorify pass sees, not a ``double`` argument it would specialize)."""
    for value in example_inputs:
        if isinstance(value, torch.SymInt) or isinstance(value, torch.Tensor) and not all(
                is_concrete_int(s) for s in (*value.shape, *value.stride())):
            return False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _LAYER_NORM_CALLS:
            others = [node.args[1:2], node.args[4:], node.kwargs.get("eps"),
                      node.kwargs.get("normalized_shape")]
            if any(isinstance(n, torch.fx.Node) for n in pytree.tree_leaves(others)):
                return False
    return True


class UnrecordableOp(Exception):
    """An op took a value the expansion has no node for, or returned no tensor."""


class _Recorder(TorchDispatchMode):
    """Records every op dispatched under it as a node of ``graph`` (at the graph's
    insertion point) whose ``val`` is the op's fake result; ``env`` maps the id of each
    known value (tensor or symbolic scalar) to its node."""

    def __init__(self, graph: torch.fx.Graph, env: dict[int, torch.fx.Node]):
        super().__init__()
        self.graph, self.env = graph, env
        self.created: list[torch.fx.Node] = []
        self._alive: list[Any] = []  # the recorded results: their ids stay theirs

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        parts = [out] if isinstance(out, torch.Tensor) else list(out) \
            if isinstance(out, (tuple, list)) else [None]
        if not all(isinstance(part, torch.Tensor) for part in parts):
            raise UnrecordableOp(f"{func} returned {type(out).__name__}, not tensors")
        node = self._add(func, pytree.tree_map(self._node_of, args),
                         pytree.tree_map(self._node_of, kwargs), out)
        if not isinstance(out, torch.Tensor):  # (var, mean) of the reference's var_mean
            for k, part in enumerate(parts):
                self._add(operator.getitem, (node, k), {}, part)
        return out

    def _add(self, target: Any, args: Any, kwargs: Any, value: Any) -> torch.fx.Node:
        node = self.graph.call_function(target, args, kwargs, name=_name(target))
        node.meta["val"] = value
        self.created.append(node)
        self._alive.append(value)
        if isinstance(value, torch.Tensor):
            self.env[id(value)] = node
        return node

    def _node_of(self, value: Any) -> Any:
        if isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
            node = self.env.get(id(value))
            if node is None:
                raise UnrecordableOp(f"no node holds the argument {value!r}")
            return node
        return value


def expand_layer_norms(gm: torch.fx.GraphModule) -> int:
    """Replace each ``aten.native_layer_norm`` node of the ATen graph ``gm`` with the
    nodes :func:`native_layer_norm` dispatches; returns how many it replaced. The first
    layer norm of each signature (operand shapes, strides, dtypes; shape and ``eps``) is
    recorded, the others replay its nodes (a 6-layer GPT-2 has 13 layer norms and one
    signature). A node it cannot expand stays (it then runs on the host, reported as a
    fallback)."""
    expanded = 0
    recorded: dict[tuple, _Recording] = {}
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.native_layer_norm.default:
            expanded += _expand(gm.graph, node, recorded)
    if expanded:
        gm.recompile()
    return expanded


class _Ref:
    """An argument of a recorded node: the layer norm's ``index``-th input node
    (``made`` False) or the ``index``-th node the recording made."""

    __slots__ = ("made", "index")

    def __init__(self, made: bool, index: int):
        self.made, self.index = made, index


class _Recording:
    """One layer norm's nodes, as a template another layer norm of the same signature
    replays: each node's target, arguments (:class:`_Ref` for nodes) and result
    metadata, and which nodes are ``(out, mean, rstd)``."""

    def __init__(self, inputs: list[torch.fx.Node], made: list[torch.fx.Node],
                 results: list[torch.fx.Node]):
        ref = {n: _Ref(False, k) for k, n in enumerate(inputs)}
        ref.update({n: _Ref(True, k) for k, n in enumerate(made)})
        self.steps = [(n.target, torch.fx.node.map_arg(n.args, ref.__getitem__),
                       torch.fx.node.map_arg(n.kwargs, ref.__getitem__),
                       pytree.tree_map_only(torch.Tensor, _metadata, n.meta["val"]))
                      for n in made]
        self.results = [made.index(n) for n in results]

    def replay(self, graph: torch.fx.Graph, inputs: list[torch.fx.Node], fake_mode: Any
               ) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
        """The nodes for a layer norm on ``inputs``, each with a fresh fake value of the
        recorded metadata (~11 us, against ~250 us to run the op on fake tensors)."""
        made: list[torch.fx.Node] = []

        def node_of(value: Any) -> Any:
            if isinstance(value, _Ref):
                return made[value.index] if value.made else inputs[value.index]
            return value

        device = inputs[0].meta["val"].device
        for target, args, kwargs, metadata in self.steps:
            node = graph.call_function(target, pytree.tree_map(node_of, args),
                                       pytree.tree_map(node_of, kwargs), name=_name(target))
            node.meta["val"] = pytree.tree_map_only(
                _Metadata, lambda m: fake_value(fake_mode, *m, device), metadata)
            made.append(node)
        return made, [made[k] for k in self.results]


class _Metadata(tuple):
    """(shape, stride, dtype) of a recorded value (a pytree leaf)."""


def _metadata(value: torch.Tensor) -> _Metadata:
    return _Metadata((tuple(value.shape), value.stride(), value.dtype))


def _name(target: Any) -> str | None:
    """A recorded node's name, as AOTAutograd names it (the op's name), else FX's."""
    packet = getattr(target, "overloadpacket", None)
    return packet.__name__ if packet is not None else None


def _signature(node: torch.fx.Node) -> tuple:
    """What the recorded nodes of a layer norm depend on: each operand's shape, stride,
    dtype and device, which operands are one node (a weight passed as the bias too), and
    the other arguments."""
    first = {}

    def part(position: int, arg: Any) -> Any:
        if isinstance(arg, torch.fx.Node):
            val = arg.meta["val"]
            return ("tensor", first.setdefault(arg, position), tuple(val.shape), val.stride(),
                    val.dtype, val.device)
        return tuple(arg) if isinstance(arg, (list, tuple)) else arg
    return tuple(part(k, arg) for k, arg in enumerate(node.args))


def _expand(graph: torch.fx.Graph, node: torch.fx.Node,
            recorded: dict[tuple, _Recording]) -> bool:
    if any(user.target is not operator.getitem for user in node.users) or not all(
            isinstance(n.meta.get("val"), torch.Tensor) for n in node.all_input_nodes):
        return False
    inputs = node.all_input_nodes
    key = _signature(node)
    with graph.inserting_before(node):
        if key in recorded:
            made, results = recorded[key].replay(graph, inputs,
                                                 inputs[0].meta["val"].fake_mode)
        else:
            recording = _record(graph, node)
            if recording is None:
                return False
            made, results = recording
            recorded[key] = _Recording(inputs, made, results)
    for user in list(node.users):
        user.replace_all_uses_with(results[user.args[1]])
        graph.erase_node(user)
    graph.erase_node(node)
    for made_node in reversed(made):  # mean/rstd conversions nobody reads
        if not made_node.users:
            graph.erase_node(made_node)
    return True


def _record(graph: torch.fx.Graph, node: torch.fx.Node
            ) -> tuple[list[torch.fx.Node], list[torch.fx.Node]] | None:
    """Run :func:`native_layer_norm` on ``node``'s fake values, recording its ops as
    nodes (at the graph's insertion point): (the nodes made, the result nodes), or None
    (nothing left in the graph) when an op took a value no node holds or a result is
    no new node."""
    env: dict[int, torch.fx.Node] = {}
    values = torch.fx.node.map_arg(node.args, lambda n: _known(env, n))
    with values[0].fake_mode, _Recorder(graph, env) as recorder:
        try:
            results = native_layer_norm(*values)
        except UnrecordableOp:
            results = None
    made = recorder.created
    result_nodes = [env.get(id(r)) for r in results or ()]
    if results is None or not all(n in made for n in result_nodes):
        for node_made in reversed(made):  # nothing stays of a failed recording
            graph.erase_node(node_made)
        return None
    return made, result_nodes


def _known(env: dict[int, torch.fx.Node], node: torch.fx.Node) -> Any:
    """``node``'s fake value, remembered in ``env`` as held by ``node``."""
    value = node.meta["val"]
    env[id(value)] = node
    return value

"""Data-dependent sizes a device kernel can count: ``nonzero`` and boolean-mask indexing.

``x[mask]`` and ``torch.nonzero(m)`` have as many rows as their input has nonzero
elements. Before a graph is staged (:mod:`simaccel.staged`) :func:`count_on_device`
rewrites each so that the device computes that size:

* ``nonzero(m)`` gets a count before it, ``sum(m != 0)`` (a device reduction), read back
  as the output size ``u0`` (``_local_scalar_dense``, a host step of one element); the
  nonzero node then lists that readback among its size inputs (``meta[SIZE_INPUTS]``) and
  runs on the device in the next stage (:mod:`simaccel.codegen.lower_nonzero`);
* ``x[mask]`` becomes ``x[nonzero(mask).unbind(1)]``: the nonzero above, then the
  ordinary integer-index gather (one index tensor per mask dim, as ATen computes it);
* ``masked_select(x, mask)`` is ``x[mask]`` with both broadcast to one shape;
* ``t.size(d)`` of such an output, where it is the counted size itself, is the readback,
  so the host does not download a tensor only to read its size.

Only the shapes whose meaning is plain are rewritten (a mask with no other index tensor
beside it); any other data-dependent op stays a host step with its reason.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from simaccel.guards.dynamo import fake_mode_of

aten = torch.ops.aten

#: a node's readbacks whose values are sizes of its output (``meta`` key)
SIZE_INPUTS = "simaccel_size_inputs"


def size_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    return node.meta.get(SIZE_INPUTS, [])


def count_on_device(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm``'s nonzero and boolean-mask index nodes in place (see the module
    doc); returns how many were rewritten."""
    graph = gm.graph
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.nonzero.default and _count_nonzero(graph, node):
            rewritten += 1
        elif node.target is aten.index.Tensor and _mask_to_nonzero(graph, node):
            rewritten += 1
        elif node.target is aten.masked_select.default and _masked_select(graph, node):
            rewritten += 1
    if rewritten:
        _sizes_from_readbacks(graph)
        graph.lint()
        gm.recompile()
    return rewritten


def _fresh_symbol(value: Any) -> bool:
    """A size that is one new data-dependent symbol (``u0``), nothing derived from it."""
    return isinstance(value, torch.SymInt) and len(free_unbacked_symbols(value)) == 1 \
        and str(value).startswith("u") and str(value)[1:].isdigit()


def _count_nonzero(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """Give ``nonzero(x)`` a device count of its rows, read back as its size input."""
    x = node.args[0]
    x_val, val = x.meta.get("val"), node.meta.get("val")
    if not isinstance(x_val, torch.Tensor) or x_val.ndim == 0 or \
            not isinstance(val, torch.Tensor) or not _fresh_symbol(val.shape[0]):
        return False
    fake_mode = fake_mode_of([x_val])
    with graph.inserting_before(node), fake_mode:
        flags = x
        if x_val.dtype != torch.bool:
            flags = _call(graph, aten.ne.Scalar, (x, 0), {})
        count = _call(graph, aten.sum.default, (flags,), {"dtype": torch.int64})
        readback = graph.call_function(aten._local_scalar_dense.default, (count,))
        readback.meta["val"] = val.shape[0]
    node.meta[SIZE_INPUTS] = [readback]
    return True


def _mask_to_nonzero(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """``x[..., mask, ...]`` (the only index tensor) as an integer-index gather on the
    coordinates of the mask's nonzeros."""
    x, indices = node.args[0], list(node.args[1])
    tensors = [p for p, t in enumerate(indices) if t is not None]
    if len(tensors) != 1:
        return False
    p = tensors[0]
    mask = indices[p]
    mask_val, val = mask.meta.get("val"), node.meta.get("val")
    if not isinstance(mask_val, torch.Tensor) or mask_val.dtype != torch.bool \
            or mask_val.ndim == 0 or not isinstance(val, torch.Tensor) \
            or not _fresh_symbol(val.shape[p]):
        return False
    fake_mode = fake_mode_of([mask_val])
    with graph.inserting_before(node), fake_mode:
        coords = graph.call_function(aten.nonzero.default, (mask,))
        coords.meta["val"] = torch.empty((val.shape[p], mask_val.ndim), dtype=torch.int64,
                                         device=mask_val.device)
        columns = [_call(graph, aten.select.int, (coords, 1, d), {})
                   for d in range(mask_val.ndim)]
    node.args = (x, [*indices[:p], *columns, *indices[p + 1:]])
    return _count_nonzero(graph, coords)


def _masked_select(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """``masked_select(x, mask)`` as ``expand(x)[expand(mask)]`` (ATen broadcasts both)."""
    x, mask = node.args[:2]
    x_val, mask_val = x.meta.get("val"), mask.meta.get("val")
    if not isinstance(x_val, torch.Tensor) or not isinstance(mask_val, torch.Tensor):
        return False
    shape = torch.broadcast_shapes(x_val.shape, mask_val.shape)
    if len(shape) == 0:
        return False
    with graph.inserting_before(node), fake_mode_of([x_val]):
        x_b, mask_b = (v if tuple(v.meta["val"].shape) == tuple(shape)
                       else _call(graph, aten.expand.default, (v, list(shape)), {})
                       for v in (x, mask))
        gather = graph.call_function(aten.index.Tensor, (x_b, [mask_b]))
        gather.meta["val"] = node.meta["val"]
    if not _mask_to_nonzero(graph, gather):
        graph.erase_node(gather)
        return False
    node.replace_all_uses_with(gather)
    graph.erase_node(node)
    return True


def _call(graph: torch.fx.Graph, target: Any, args: tuple, kwargs: dict) -> torch.fx.Node:
    """A new node of ``target`` with its value computed on the args' fake values (call
    under the graph's fake mode)."""
    node = graph.call_function(target, args, kwargs)
    fake_args = torch.fx.node.map_arg(args, lambda n: n.meta["val"])
    node.meta["val"] = target(*fake_args, **kwargs)
    return node


def _sizes_from_readbacks(graph: torch.fx.Graph) -> None:
    """``sym_size(t, d)`` that is a counted size: its readback instead."""
    readback_of = {str(r.meta["val"]): r for n in graph.nodes for r in size_inputs(n)}
    for node in list(graph.nodes):
        if node.target is not aten.sym_size.int:
            continue
        readback = readback_of.get(str(node.meta.get("val")))
        if readback is not None:
            node.replace_all_uses_with(readback)
            graph.erase_node(node)

"""Hand-written softmax attention in Dynamo's graph, rewritten as one SDPA call.

Model code written before ``F.scaled_dot_product_attention`` (Hugging Face's GPT-2 and
its "eager" attention, nanoGPT's slow path, many research models) spells attention out:

    w = q @ k.transpose(-1, -2)            # scores
    w = w / math.sqrt(head_dim) * factor   # scale: numbers, or a lifted float
    w = torch.where(causal, w, torch.finfo(w.dtype).min)   # and/or ``w + mask``
    out = w.softmax(dim=-1) @ v            # dropout between, inactive in eval

Traced as written it is two batched GEMMs, a score matrix written and read three times, a
softmax row kernel, and copies of q, k and v into GEMM layout: ~120 us of a 530 us GPT-2
layer (2x64 tokens, width 128). :func:`fuse_softmax_attention` replaces it with
``F.scaled_dot_product_attention(q * factors, k, v, attn_mask=M, scale=numbers)``, which
the device runs as its fused attention kernel (:mod:`simaccel.codegen.templates_attention`:
q, k and v read in place, the scores never leave cache, keys the mask hides in every row
of a block skipped). ``M`` is the masks applied to 0 in the graph's order (a select
becomes ``where(cond, M, fill)``, an addition ``M + mask``), so ``w + M`` equals the
masked scores: exactly where kept; where hidden, ``fill`` (plus any added mask), as
``w + fill == fill`` in floating point for ``|w| < 1e22`` when ``|fill| >= 1e30``: only
such fills (-inf too) are taken, not a small one such as -1e4 that ``w`` would shift. A
row hidden whole by a finite fill gets uniform weights, as in eager. A row whose scores
the mask makes -inf whole is NaN in eager's softmax, where SDPA gives 0: where that can
happen (an added mask, a fill of -inf) the output's rows are set to NaN where the mask
is -inf whole (:func:`_nan_where_hidden`: a reduction over the mask and a select, fused
into small kernels). Scale factors are moved from the scores to q (numbers into SDPA's
``scale``): the same value up to rounding (~1 ulp of the scores).

Spellings taken, as real model code writes them: ``@``, ``torch.matmul`` or the method;
``transpose`` or ``permute(0, 1, 3, 2)`` of k; ``*`` or ``/`` by a number, a lifted float,
a 0-d tensor or a 0-d ``torch.full`` (Hugging Face's GPT-2 divisor: its value, rounded to
its dtype, becomes a number); ``torch.where(keep, w, fill)`` or ``w.masked_fill(hidden,
fill)`` with a number or a 0-d ``torch.full`` fill; ``w + mask`` or ``mask + w``; casts to
the dtype the scores have; the softmax as a function or method, in the scores' dtype or
(for 16-bit scores, Llama's ``softmax(..., dtype=torch.float32).to(q.dtype)``) in float32,
which is what the kernel computes in.

The rewrite runs before AOTAutograd traces the graph, so training graphs get the fused
forward and SDPA's backward (:mod:`simaccel.attention`) too; an active dropout on the
weights stops the match (its mask is drawn per weight). Every node of the pattern but q,
k, v and the masks must have the next as its only user (the weights are not returned,
the scores not reused), and q, k and v must be 4-D of one floating dtype (the kernel's
operands).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from simaccel.codegen.sizes import is_value, same_size

#: the largest mask fill taken (see the module doc): hidden scores then equal the fill
MAX_FILL = -1e30

_MATMULS = {operator.matmul, torch.matmul}
_SOFTMAXES = {torch.softmax, F.softmax, torch.nn.functional.softmax}
_MULS = {operator.mul, torch.mul}
_DIVS = {operator.truediv, torch.div}
_ADDS = {operator.add, torch.add}
_LAST_TWO = {(-1, -2), (-2, -1), (2, 3), (3, 2), (-1, 2), (2, -1), (3, -2), (-2, 3)}


@dataclass
class _Match:
    """One hand-written attention: its operands and the nodes it replaces."""

    query: torch.fx.Node
    key: torch.fx.Node
    value: torch.fx.Node
    scale: float = 1.0
    #: factors that are graph values (a lifted float, a 0-d tensor): (node, divides)
    factors: list[tuple[torch.fx.Node, bool]] = field(default_factory=list)
    #: masks innermost first: ("where", cond, fill, keep_if_true, fill as written) or
    #: ("add", mask)
    masks: list[tuple[Any, ...]] = field(default_factory=list)
    #: the replaced nodes, the output's matmul first
    nodes: list[torch.fx.Node] = field(default_factory=list)


def fuse_softmax_attention(gm: torch.fx.GraphModule) -> list[str]:
    """Rewrite each hand-written softmax attention of ``gm`` as one SDPA call; one line
    per rewrite, naming the replaced output node and the pattern it matched."""
    done = []
    for node in list(gm.graph.nodes):
        match = _match(node)
        if match is not None and _replace(gm.graph, match):
            done.append(f"'{node.name}': {_describe(match)} -> scaled_dot_product_attention")
    if done:
        gm.recompile()
    return done


def _arg(node: torch.fx.Node, index: int, name: str, default: Any = None) -> Any:
    """An argument of a call node, by position (after ``self`` for methods) or name."""
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, default)


def _is_call(node: Any, functions: set[Any], method: str) -> bool:
    return isinstance(node, torch.fx.Node) and (
        node.op == "call_function" and node.target in functions
        or node.op == "call_method" and node.target == method)


def _single_user(node: torch.fx.Node) -> bool:
    return len(node.users) == 1


def _value(node: Any) -> Any:
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else node


def _match(out: torch.fx.Node) -> _Match | None:
    """The attention whose output is the matmul ``out``, or None."""
    if not _is_call(out, _MATMULS, "matmul") or len(out.args) != 2 or out.kwargs:
        return None
    weights, value = out.args
    nodes = [out]
    if _same_or_cast(weights, _value(out)):  # .to(v.dtype) after a float32 softmax
        nodes.append(weights)
        weights = weights.args[0]
    scores = _softmax_input(weights)
    if scores is None:
        return None
    match = _Match(query=None, key=None, value=value, nodes=[*nodes, weights])  # type: ignore
    node, masks, made = scores, [], []
    while _single_user(node) and (step := _step(node)) is not None:
        below, kind = step
        if kind[0] == "same":
            pass
        elif kind[0] == "scale":
            factor, divides, written = kind[1:]
            if isinstance(factor, torch.fx.Node):
                match.factors.append((factor, divides))
            else:
                match.scale *= 1.0 / factor if divides else factor
                made.append(written)
        elif match.factors or match.scale != 1.0:
            return None  # a mask below a scaling: the fill would be scaled
        else:
            masks.append(kind)
        match.nodes.append(node)
        node = below
    match.masks = masks[::-1]
    if not _scores_product(node, match):
        return None
    # a fill or a factor made for the pattern (torch.full) goes with it
    made += [m[4] for m in masks if m[0] == "where"]
    match.nodes += [n for n in made if isinstance(n, torch.fx.Node)]
    return match if _operands_fit(match, _value(scores), _value(out)) else None


def _same_or_cast(node: Any, result: Any) -> bool:
    """Whether ``node`` is ``x.to(dtype)`` or ``x.type(dtype)`` with one user and a
    floating result of ``result``'s dtype (None: ``x``'s own)."""
    if not _is_call(node, set(), "to") and not _is_call(node, set(), "type") \
            or not _single_user(node) or len(node.args) != 2 or node.kwargs:
        return False
    source, out = _value(node.args[0]), _value(node)
    if not all(isinstance(t, torch.Tensor) for t in (source, out)):
        return False
    want = source.dtype if result is None else result.dtype
    return out.is_floating_point() and out.dtype == want and isinstance(
        node.args[1], torch.dtype) and source.device == out.device


def _softmax_input(weights: Any) -> torch.fx.Node | None:
    """The input of ``weights`` if it is a last-dim softmax with one user, computed in its
    input's dtype or, for 16-bit input, float32 (as the fused kernel computes it)."""
    if not _is_call(weights, _SOFTMAXES, "softmax") or not _single_user(weights):
        return None
    dim = _arg(weights, 1, "dim")
    # F.softmax(input, dim, _stacklevel, dtype); torch.softmax and the method: (.., dim, dtype)
    dtype = _arg(weights, 3 if weights.target is F.softmax else 2, "dtype")
    source = weights.args[0]
    value = _value(source)
    if not isinstance(value, torch.Tensor) or dtype not in (None, value.dtype) and not (
            dtype is torch.float32 and value.dtype in (torch.bfloat16, torch.float16)):
        return None
    return source if dim in (-1, value.dim() - 1) else None


def _step(node: torch.fx.Node) -> tuple[torch.fx.Node, tuple[Any, ...]] | None:
    """(the scores below, what ``node`` does to them) for one step down from the
    softmax: ``("where", cond, fill, keep_if_true, fill as written)``, ``("add", mask)``,
    ``("scale", factor, divides, factor as written)`` or ``("same",)`` (a cast to the
    dtype it has); None if ``node`` is none of these."""
    args = node.args
    if _same_or_cast(node, None):
        return args[0], ("same",)
    if node.kwargs or len(args) not in (2, 3):
        return None
    fill = _fill(args[2]) if len(args) == 3 else None
    if node.op == "call_function" and node.target is torch.where and len(args) == 3:
        if isinstance(args[1], torch.fx.Node) and fill is not None:
            return args[1], ("where", args[0], fill, True, args[2])
    elif _is_call(node, {torch.masked_fill}, "masked_fill") and len(args) == 3:
        if fill is not None:
            return args[0], ("where", args[1], fill, False, args[2])
    elif len(args) != 2:
        return None
    elif _is_call(node, _ADDS, "add") and all(isinstance(x, torch.fx.Node) for x in args):
        scores, mask = args if _reaches_product(args[0]) else args[::-1]
        return scores, ("add", mask)
    elif _is_call(node, _MULS, "mul") or _is_call(node, _DIVS, "div"):
        divides = node.target in _DIVS or node.target == "div"
        scores, factor = args
        if not divides and _scalar(scores) and not _scalar(factor):
            scores, factor = factor, scores  # 2 * w
        if _scalar(factor) and isinstance(scores, torch.fx.Node):
            constant = _full_value(factor) if isinstance(factor, torch.fx.Node) else None
            if constant != 0:  # a torch.full([], c): c, rounded to its dtype
                return scores, ("scale", factor if constant is None else constant, divides,
                                factor)
    return None


def _fill(fill: Any) -> float | None:
    """A mask's fill value where it is at most :data:`MAX_FILL` (-inf too): a number, or
    a 0-d ``torch.full`` of one (as Hugging Face's GPT-2 makes it); else None."""
    fill = _full_value(fill) if isinstance(fill, torch.fx.Node) else fill
    if type(fill) not in (int, float) or math.isnan(fill) or fill > MAX_FILL:
        return None
    return float(fill)


def _full_value(node: torch.fx.Node) -> float | None:
    """The value of ``torch.full([], number, dtype=...)`` (rounded to its dtype, as the
    tensor holds it), or None if ``node`` is not one."""
    if node.op != "call_function" or node.target is not torch.full or len(node.args) != 2 \
            or node.args[0] not in ([], ()) or not set(node.kwargs) <= {"dtype", "device"} \
            or type(node.args[1]) not in (int, float):
        return None
    return _in_dtype(node.args[1], node.kwargs.get("dtype") or torch.get_default_dtype())


def _reaches_product(node: Any, depth: int = 8) -> bool:
    """Whether single-user masks and scalings lead from ``node`` down to ``q @ k^T``
    (which operand of an addition is the scores)."""
    for _ in range(depth):
        if not isinstance(node, torch.fx.Node) or not _single_user(node):
            return False
        if _is_call(node, _MATMULS, "matmul") and len(node.args) == 2:
            return _transposed(node.args[1]) is not None
        if _is_call(node, _ADDS, "add"):
            return any(_reaches_product(x, depth - 1) for x in node.args)
        step = _step(node)
        if step is None:
            return False
        node = step[0]
    return False


def _scalar(factor: Any) -> bool:
    """A number, or a graph value that is one (a SymFloat or SymInt, a 0-d tensor)."""
    if type(factor) in (int, float):
        return math.isfinite(factor) and factor != 0
    value = _value(factor)
    return isinstance(value, (torch.SymFloat, torch.SymInt)) or (
        isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point())


def _scores_product(node: Any, match: _Match) -> bool:
    """Record q and k if ``node`` is ``q @ k.transpose(-1, -2)`` with one user."""
    if not _is_call(node, _MATMULS, "matmul") or len(node.args) != 2 or node.kwargs \
            or not _single_user(node):
        return False
    query, key_t = node.args
    key = _transposed(key_t)
    if key is None or not isinstance(query, torch.fx.Node):
        return False
    match.query, match.key = query, key
    match.nodes.append(node)
    if _single_user(key_t):
        match.nodes.append(key_t)
    return True


def _transposed(node: Any) -> torch.fx.Node | None:
    """``x`` if ``node`` swaps the last two dims of a 4-D ``x``, else None."""
    if not isinstance(node, torch.fx.Node) or not node.args:
        return None
    if _is_call(node, {torch.transpose}, "transpose") and len(node.args) == 3:
        dims = tuple(node.args[1:])
    elif _is_call(node, {torch.permute}, "permute"):
        dims = tuple(node.args[1]) if len(node.args) == 2 else tuple(node.args[1:])
        dims = (2, 3) if dims == (0, 1, 3, 2) else ()
    else:
        return None
    return node.args[0] if dims in _LAST_TWO else None


def _operands_fit(match: _Match, scores: Any, out: Any) -> bool:
    """q, k, v and the scores 4-D of one floating dtype, the output too, the scores
    (b, h, queries, keys) as the kernel's, each mask broadcast to no more than them
    (sizes compared without adding a guard)."""
    values = [_value(n) for n in (match.query, match.key, match.value)]
    if not all(isinstance(v, torch.Tensor) and v.dim() == 4 for v in (*values, scores)):
        return False
    q, k, v = values
    if not q.is_floating_point() or len({q.dtype, k.dtype, v.dtype, scores.dtype,
                                         getattr(out, "dtype", None)}) != 1:
        return False
    pairs = [*zip(scores.shape, (*q.shape[:3], k.shape[2])), *zip(k.shape[:2], q.shape[:2]),
             *zip(v.shape[:3], k.shape[:3])]
    if not all(same_size(a, b) for a, b in pairs):
        return False
    return all(_mask_fits(mask, scores) for mask in match.masks)


def _mask_fits(mask: tuple[Any, ...], scores: torch.Tensor) -> bool:
    tensor = _value(mask[1])
    if not isinstance(tensor, torch.Tensor) or tensor.dim() > 4:
        return False
    if mask[0] == "where" and tensor.dtype != torch.bool:
        return False
    if mask[0] == "add" and not tensor.is_floating_point():
        return False
    return all(is_value(n, 1) or same_size(n, full)
               for n, full in zip(reversed(tensor.shape), reversed(scores.shape)))


def _replace(graph: torch.fx.Graph, match: _Match) -> bool:
    """Insert the SDPA call before the output matmul and remove the pattern; False (the
    graph as it was) if SDPA refuses the operands on their example values."""
    out = match.nodes[0]
    dtype = _value(match.query).dtype
    with graph.inserting_before(out):
        added = []
        query = match.query
        for factor, divides in match.factors:
            query = graph.call_function(operator.truediv if divides else operator.mul,
                                        (query, factor))
            added.append(query)
        mask = _additive_mask(graph, match.masks, dtype, added)
        sdpa = graph.call_function(
            F.scaled_dot_product_attention, (query, match.key, match.value),
            {"attn_mask": mask, "dropout_p": 0.0, "is_causal": False,
             "scale": match.scale})
        added.append(sdpa)
        if _may_hide_whole_rows(match.masks, dtype):
            sdpa = _nan_where_hidden(graph, mask, sdpa, added)
    if not _example_values(added, _value(match.query)):
        for node in reversed(added):
            graph.erase_node(node)
        return False
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
        if key in out.meta:
            sdpa.meta[key] = out.meta[key]
    out.replace_all_uses_with(sdpa)
    for node in match.nodes:
        if not node.users:
            graph.erase_node(node)
    return True


def _may_hide_whole_rows(masks: list[tuple[Any, ...]], dtype: torch.dtype) -> bool:
    """Whether the combined mask may be -inf across a whole row: an added mask (its
    values are not known), or a fill that is -inf in the scores' ``dtype`` (float32's
    minimum is, in bfloat16)."""
    return any(m[0] == "add" or _in_dtype(m[2], dtype) == -math.inf for m in masks)


def _in_dtype(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to ``dtype``, as a tensor of it holds it."""
    return float(torch.tensor(value, dtype=torch.float64).to(dtype).item())


def _nan_where_hidden(graph: torch.fx.Graph, mask: torch.fx.Node, out: torch.fx.Node,
                      added: list[torch.fx.Node]) -> torch.fx.Node:
    """``out`` with NaN in each row whose scores the mask makes -inf whole: eager's
    softmax of such a row is NaN, where SDPA and the fused kernel give 0."""
    hidden = graph.call_function(operator.eq, (mask, -math.inf))
    rows = graph.call_method("all", (hidden, -1), {"keepdim": True})
    fixed = graph.call_function(torch.where, (rows, math.nan, out))
    added += [hidden, rows, fixed]
    return fixed


def _example_values(nodes: list[torch.fx.Node], like: torch.Tensor) -> bool:
    """Give each new node its example value, computed in the fake mode of ``like``
    (Dynamo's), as Dynamo gives its own nodes; False if an op refuses its operands."""
    fake_mode = getattr(like, "fake_mode", None)
    if fake_mode is None:
        return False
    try:
        with fake_mode:
            for node in nodes:
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), _value)
                target = getattr(args[0], node.target) if node.op == "call_method" \
                    else node.target
                node.meta["example_value"] = target(*(args[1:] if node.op == "call_method"
                                                      else args), **kwargs)
    except Exception:  # noqa: BLE001 - a pattern SDPA does not take stays as written
        return False
    return True


def _additive_mask(graph: torch.fx.Graph, masks: list[tuple[Any, ...]],
                   dtype: torch.dtype, added: list[torch.fx.Node]) -> torch.fx.Node | None:
    """The masks applied to 0 in their order (see the module doc), in the scores'
    dtype; None without masks. Each node made is appended to ``added``."""
    total: Any = None
    for mask in masks:
        if mask[0] == "where":
            _, cond, fill, keep_if_true, _ = mask
            if total is None:  # a 0-d zero of the dtype: float64's minimum stays finite
                total = graph.call_function(torch.zeros, ((),), {"dtype": dtype})
                added.append(total)
            kept, hidden = (total, fill) if keep_if_true else (fill, total)
            total = graph.call_function(torch.where, (cond, kept, hidden))
            added.append(total)
        elif total is not None:
            total = graph.call_function(operator.add, (total, mask[1]))
            added.append(total)
        else:
            total = mask[1]
    if total is None:
        return None
    added.append(graph.call_method("to", (total, dtype)))
    return added[-1]


def _describe(match: _Match) -> str:
    """The matched pattern in a line: its scale and masks."""
    scale = [f"{match.scale:.6g}"] + [f"{'/' if d else '*'} {n.name}"
                                      for n, d in match.factors]
    masks = [f"where(..., {m[2]:.3g})" if m[0] == "where" else f"+{m[1].name}"
             for m in match.masks]
    return f"softmax(q @ k^T * {' '.join(scale)}{''.join(' ' + m for m in masks)}) @ v"

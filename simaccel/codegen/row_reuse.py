"""Row kernels keep a costly per-element value for the later pass that needs it again.

Fusion inlines a value into every consumer. A softmax row kernel therefore computes
``exp(x - max)`` in its sum pass and again in its output pass: two transcendental
evaluations per element where one would do (measured on the 4x8x128x128 causal softmax
of an attention: 441 us with the exp computed twice, 254 us with it stored and reloaded,
2 threads). Here the reduction pass also stores the value into the output pass's own
output element, and the output pass loads it from there instead of computing it.

The rewrite is taken only where it cannot change a result:

* the value is the same computation in both passes: the same ops on the same constants
  and on loads of the same buffers at the same elements, compared on the element each
  load reads at every position of the row kernel's loop (:func:`read_positions`; over
  dynamic sizes on flat offsets, :func:`~.fusion_rows.flat_offset`), so the differently
  named loop variables of the two passes do not matter;
* the output pass stores a value of that very dtype, float32 or float64 (a 16-bit output
  would round it), one element per position of its loop, so the stored value is exactly
  the one it would have recomputed and no other position reads it;
* row fusion already guarantees that no stage writes what an earlier stage reads, so
  both passes see the same inputs.

Only the numba form is rewritten; tier 0 (:mod:`.emit_numpy`) computes the same values
from the kernel as fused.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from simaccel.codegen.emit import COSTLY_OPS
from simaccel.codegen.fusion_rows import (joins_as_pointwise, loop_positions,
                                          pointwise_geometry, reduction_geometry, sources)
from simaccel.codegen.ir import (Const, Expr, IndexValue, Load, Op, PointwiseKernel,
                                 ReductionKernel, RowKernel, affine, contiguous_strides,
                                 expr_nodes)
from simaccel.codegen.sizes import source

#: the dtypes a value is stored in exactly as the pass computes it
EXACT_DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class SideStore:
    """A reduction stage also stores ``value`` (a node of its body) at ``offset`` (an
    index over its own loop variables) of ``buffer``, inside its reduced loop."""

    value: Expr
    buffer: str
    offset: str


@dataclass(frozen=True)
class RowReuse:
    """The rewrite of one row kernel: per stage number, the side stores of a reduction
    stage and the body a pointwise stage computes instead of its own."""

    side_stores: dict[int, list[SideStore]]
    bodies: dict[int, Expr]
    #: pointwise stages whose whole value a reduction stage stores: not emitted at all
    dropped: frozenset[int] = frozenset()


def plan_reuse(k: RowKernel) -> RowReuse:
    """Which costly values of ``k``'s pointwise stages an earlier reduction stage stores
    for them (see the module doc); empty when none qualifies."""
    rows, inner = source(k.rows), sources(k.inner)
    stores: dict[int, list[SideStore]] = {}
    bodies: dict[int, Expr] = {}
    dropped: set[int] = set()
    for b, stage in enumerate(k.stages):
        if not joins_as_pointwise(stage) or stage.body.dtype not in EXACT_DTYPES:
            continue
        geometry = pointwise_geometry(stage, rows, inner)
        if geometry is None:
            continue
        found = _earlier_match(k.stages[:b], stage, geometry)
        if found is None:
            continue
        a, value, node = found
        own = stage.out.offset_source(stage.index)
        at = geometry.element(own)
        if at is None or not _static(at):
            continue
        stores.setdefault(a, []).append(
            SideStore(value, stage.out.buffer, _offset_in(k.stages[a], at)))
        if node is stage.body:
            dropped.add(b)  # the side store writes every element the stage would
        else:
            bodies[b] = _replaced(stage.body, node, Load(stage.out.buffer, own, node.dtype))
    return RowReuse(stores, bodies, frozenset(dropped))


def rewritten_stage(stage: Any, n: int, reuse: RowReuse) -> Any:
    """Stage ``n`` as the rewrite emits it (a pointwise stage with its new body)."""
    body = reuse.bodies.get(n)
    return stage if body is None else dataclasses.replace(stage, body=body)


def _earlier_match(earlier: list[Any], stage: PointwiseKernel, geometry: Any
                   ) -> tuple[int, Expr, Expr] | None:
    """(stage number, its node, ``stage``'s node) of the costliest value of ``stage``'s
    body that an earlier reduction stage computes per element, or None."""
    wanted = _costly_nodes(stage.body, geometry)
    if not wanted:
        return None
    best = None
    for a, other in enumerate(earlier):
        if not isinstance(other, ReductionKernel):
            continue
        keys = _ElementKeys(reduction_geometry(other))
        for part in other.parts:
            for node in expr_nodes([part.body]):
                match = wanted.get(keys(node))
                if match is not None and node.dtype == stage.body.dtype and \
                        (best is None or match[0] > best[0]):
                    best = (match[0], a, node, match[1])
    return None if best is None else best[1:]


def _costly_nodes(body: Expr, geometry: Any) -> dict[Any, tuple[int, Expr]]:
    """Element key -> (costly ops in it, node) of each node of ``body`` holding a costly
    op, the body itself included (a stage that only writes ``exp(x - max)`` for a GEMM,
    as a block of causal attention does: the reduction's store is the whole stage)."""
    keys = _ElementKeys(geometry)
    costs = _costly_ops(body)
    found: dict[Any, tuple[int, Expr]] = {}
    for node in expr_nodes([body]):
        cost = costs[id(node)]
        if cost and isinstance(node, Op):
            key = keys(node)
            if key is not None:
                found[key] = (cost, node)
    return found


class _ElementKeys:
    """Keys of expressions by what they compute at one position of a row: two nodes of
    different stages get equal keys when they apply the same ops to the same constants
    and to loads of the same buffer at the same element for every position of the row
    kernel's loop; None when a load's elements are not known that way (then nothing
    matches). Over static sizes a load's key is the element it reads at every position
    (any layout: strided, broadcast, per row); over dynamic ones its flat offset."""

    def __init__(self, geometry: Any):
        self.geometry = geometry
        self._names = geometry.outer + geometry.inner
        self._shape = geometry.outer_shape + geometry.inner_shape
        self._memo: dict[int, Any] = {}

    def __call__(self, node: Expr) -> Any:
        if id(node) not in self._memo:
            self._memo[id(node)] = self._key(node)
        return self._memo[id(node)]

    def _key(self, node: Expr) -> Any:
        if isinstance(node, Const):
            return ("const", node.dtype, repr(node.value))
        if isinstance(node, Load):
            if node.index_exprs:
                return None
            read = read_positions(node.offset, self._names, self._shape)
            if read is not None:
                return ("read", node.buffer, node.dtype, read)
            element = self.geometry.element(node.offset)
            if element is not None:
                return ("element", node.buffer, node.dtype, element)
            row = self.geometry.row_read(node.offset)
            return None if row is None else ("row", node.buffer, node.dtype, row)
        if isinstance(node, IndexValue):
            return None  # a loop position: named differently in every stage
        children = tuple(self(c) for c in node.children())
        if any(c is None for c in children):
            return None
        return ("op", node.name, node.dtype, children)


@functools.lru_cache(maxsize=4096)
def read_positions(offset: str, names: tuple[str, ...], shape: tuple[str, ...]
                   ) -> str | None:
    """Digest of the elements ``offset`` reads at every position of the loop over
    ``names`` (extents ``shape``, size sources; :func:`~.fusion_rows.loop_positions`);
    None over dynamic sizes or where that gives none."""
    if not all(s.isdigit() for s in shape):
        return None
    values = loop_positions(offset, names, tuple(int(s) for s in shape))
    if values is None:
        return None
    return hashlib.sha256(np.ascontiguousarray(values, dtype=np.int64).tobytes()).hexdigest()


def _costly_ops(body: Expr) -> dict[int, int]:
    """Node id -> costly ops under each node of ``body`` (a shared node counted once per
    use: a ranking, computed bottom-up in one pass)."""
    costs: dict[int, int] = {}
    stack: list[tuple[Expr, bool]] = [(body, False)]
    while stack:  # post-order: a node once its children are counted
        node, children_done = stack.pop()
        if id(node) in costs:
            continue
        if not children_done:
            stack.append((node, True))
            stack.extend((c, False) for c in node.children() if id(c) not in costs)
            continue
        own = isinstance(node, Op) and node.name in COSTLY_OPS
        costs[id(node)] = own + sum(costs[id(c)] for c in node.children())
    return costs


def _static(flat: tuple[str, str]) -> bool:
    return all(part.lstrip("-").isdigit() for part in flat)


def _offset_in(stage: ReductionKernel, flat: tuple[str, str]) -> str:
    """The index, over ``stage``'s loop variables, of the element at flat position
    ``base + step * position`` (``flat``) of its loop (rows, then the reduced extent)."""
    base, step = int(flat[0]), int(flat[1])
    names = [*stage.out_index, *stage.red_index]
    strides = contiguous_strides((*stage.out_loop_shape, *stage.red_shape))
    return affine([(name, step * stride) for name, stride in zip(names, strides)], base)


def _replaced(body: Expr, old: Expr, new: Expr) -> Expr:
    """``body`` with the node ``old`` (by identity) replaced by ``new``."""
    memo: dict[int, Expr] = {}

    def walk(node: Expr) -> Expr:
        if node is old:
            return new
        done = memo.get(id(node))
        if done is not None:
            return done
        if isinstance(node, Op):
            args = tuple(walk(a) for a in node.args)
            out = node if all(a is b for a, b in zip(args, node.args)) else \
                dataclasses.replace(node, args=args)
        elif isinstance(node, Load) and node.index_exprs:
            index = tuple(walk(a) for a in node.index_exprs)
            out = dataclasses.replace(node, index_exprs=index)
        else:
            out = node
        memo[id(node)] = out
        return out
    return walk(body)


__all__ = ["RowReuse", "SideStore", "plan_reuse", "rewritten_stage"]

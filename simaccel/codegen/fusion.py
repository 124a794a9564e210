"""Horizontal fusion: sibling reductions, and pointwise kernels run as one launch.

``x.sum(-1), x.amax(-1), x.mean(-1)`` lower to three reduction kernels that each read
all of ``x``. Reductions over the same loop nest (same output iteration space, same
reduced dims) fold into one :class:`ReductionKernel` with ``siblings``: one pass over the
input, one accumulator per distinct (op, body), one store per output (emit.py). A later
reduction joins an earlier one only if it can move up to it: it does not read what the
earlier one or any step in between writes, and nothing in between touches its output
(every step declares the buffers it ``reads`` and ``writes``, see :mod:`simaccel.codegen.ir`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simaccel.codegen.ir import (Load, Op, PointwiseKernel, ReductionKernel, StructuralKeys,
                                 expr_nodes, loads)
from simaccel.codegen.sizes import is_value

#: reductions whose combine step is branch-free: fusing them keeps the loop vectorisable.
#: (argmax/argmin/any/all branch per element and stay alone.)
FUSABLE_OPS = ("sum", "prod", "max", "min")


def can_move_above(step: Any, other: Any) -> bool:
    """True if ``step`` can run before ``other``: ``other`` neither writes what ``step``
    reads nor touches what it writes (each declares its ``reads`` and ``writes``)."""
    return not other.writes & step.reads and not (other.reads | other.writes) & step.writes


def fuse_sibling_reductions(steps: list[Any]) -> list[Any]:
    """``steps`` with every fusable reduction folded into an earlier one it can join."""
    fused: list[Any] = []
    for step in steps:
        host = _fusion_host(fused, step) if _fusable(step) else None
        if host is None:
            fused.append(step)
            continue
        host.siblings.append(step)
        host.name = f"{host.name}_{_op_label(step)}"
    return fused


def _fusable(step: Any) -> bool:
    return isinstance(step, ReductionKernel) and step.reduce_op in FUSABLE_OPS \
        and not step.siblings


def _same_loop_nest(a: ReductionKernel, b: ReductionKernel) -> bool:
    return (a.out_index == b.out_index and a.out_loop_shape == b.out_loop_shape
            and a.red_index == b.red_index and a.red_shape == b.red_shape)


def _fusion_host(earlier: list[Any], step: ReductionKernel) -> ReductionKernel | None:
    """The step of ``earlier`` that ``step`` joins, or None: among those it can move up
    to, one that already accumulates the same (op, body) (the two then share one
    accumulator, as mean and sum of the same rows do), else the nearest."""
    keys = StructuralKeys()
    hosts = []
    for candidate in reversed(earlier):
        if not can_move_above(step, candidate):
            break
        if _fusable_host(candidate) and _same_loop_nest(candidate, step):
            hosts.append(candidate)
    for host in hosts:
        if any(_same_accumulator(part, step, keys) for part in host.parts):
            return host
    return hosts[0] if hosts else None


def _same_accumulator(a: ReductionKernel, b: ReductionKernel, keys: StructuralKeys) -> bool:
    return (a.reduce_op, a.acc_dtype, keys(a.body)) == (b.reduce_op, b.acc_dtype, keys(b.body))


def _fusable_host(step: Any) -> bool:
    return isinstance(step, ReductionKernel) and step.reduce_op in FUSABLE_OPS


def _op_label(step: ReductionKernel) -> str:
    return step.name.split("_", 2)[-1]  # "reduce_<n>_<op>" (graph.kernel_name)


# --------------------------------------------------------------------------- pointwise

#: most parts one fused pointwise launch runs (bounds its source, compile time and
#: argument count: numba's entry takes every buffer)
MAX_POINTWISE_PARTS = 32
#: most buffers one fused pointwise launch takes
MAX_POINTWISE_BUFFERS = 96
#: most steps a pointwise kernel moves up to join a launch: moving it up makes its output
#: live longer, so a far move could raise a large graph's peak memory
MAX_POINTWISE_MOVE = 4


def fuse_pointwise_launches(steps: list[Any]) -> list[Any]:
    """``steps`` with each pointwise kernel folded into the pointwise launch before it,
    where it can join it: a launch then runs its parts' loop nests in turn.

    A torch.optim step lowers to a few small kernels per parameter (the bias
    corrections, the moments, the update), each a launch of its own; launching costs
    more than their loops. A part runs after the earlier parts of its launch, so it may
    read what they write; it may not write what they read or write (a rerun of the
    launch must give the same result), and it moves up past the steps in between only
    if they neither write what it reads nor touch what it writes, and at most
    :data:`MAX_POINTWISE_MOVE` steps."""
    fused = _folded(steps, lambda kept, step: _pointwise_host(kept, step)
                    if _joins_pointwise(step) else None, lambda host: host.siblings)
    for step in fused:
        if isinstance(step, PointwiseKernel) and step.siblings:
            step.name = f"{step.name}_fused{len(step.parts)}"
    return fused


def _joins_pointwise(step: Any) -> bool:
    """A plain pointwise kernel not hosting others yet."""
    return _joins_pointwise_host(step) and not step.siblings


def _pointwise_host(earlier: list[Any], step: PointwiseKernel) -> PointwiseKernel | None:
    """The launch of ``earlier`` that ``step`` joins (the nearest it can reach), or None."""
    reads, writes = step.reads, step.writes
    for candidate in reversed(earlier[-MAX_POINTWISE_MOVE:]):
        touched = candidate.reads | candidate.writes
        if _joins_pointwise_host(candidate) and not writes & touched:
            if len(candidate.parts) < MAX_POINTWISE_PARTS and \
                    len(touched | reads | writes) <= MAX_POINTWISE_BUFFERS:
                return candidate
            return None
        if not can_move_above(step, candidate):
            return None
    return None


def _joins_pointwise_host(step: Any) -> bool:
    """A plain pointwise kernel (a scatter's serial loop stays a launch of its own)."""
    return isinstance(step, PointwiseKernel) and not step.store_offset \
        and not step.accumulate and step.iter_shape is None


#: most stores one shared loop nest makes (an AdamW update's three: the two moments and
#: the parameter)
MAX_NEST_STORES = 4


def share_loop_nests(parts: list[PointwiseKernel]) -> list[PointwiseKernel]:
    """The parts of a fused pointwise launch (own kernels, in order), each part that can
    run in the loop nest of an earlier part reading the same elements made that part's
    mate (:attr:`~simaccel.codegen.ir.PointwiseKernel.mates`). An SGD step lowers to a
    parameter update ``p - lr * (0.9 * buf + g)`` and, later, the momentum update
    ``0.9 * buf + g`` into ``buf``: sharing one nest they read ``buf`` and ``g`` once.

    A part joins the nearest earlier nest it shares an operand with, where it can move up
    past the parts in between (:func:`can_move_above`), loops over the same indices and
    extents, and no store of the nest and the part reads what the other writes but at
    the element the same iteration stores: every iteration, on any thread, then sees
    what the separate loops would have."""
    return _folded(parts, lambda kept, part: _nest_to_join(kept, part)
                   if _plain_part(part) else None, lambda host: host.mates)


def _folded(steps: list[Any], host_of: Callable[[list[Any], Any], Any],
            members: Callable[[Any], list[Any]]) -> list[Any]:
    """``steps`` with each step that ``host_of(kept so far, step)`` finds a host for
    appended to that host's ``members(host)``, the others kept in order."""
    kept: list[Any] = []
    for step in steps:
        host = host_of(kept, step)
        if host is None:
            kept.append(step)
        else:
            members(host).append(step)
    return kept


def _nest_to_join(shared: list[PointwiseKernel], part: PointwiseKernel
                  ) -> PointwiseKernel | None:
    """The nest of ``shared`` that ``part`` joins (see :func:`share_loop_nests`), or None."""
    operands = _elementwise_reads(part)
    for nest in reversed(shared):
        if operands & (_elementwise_reads(nest) | nest.writes) and _fits_nest(nest, part):
            return nest
        if not all(can_move_above(part, store) for store in nest.stores):
            return None
    return None


def _fits_nest(host: PointwiseKernel, part: PointwiseKernel) -> bool:
    """Whether ``part`` can run in ``host``'s loop nest, after its stores."""
    stores = host.stores
    if len(stores) >= MAX_NEST_STORES or part.index != host.index or part.shape != host.shape \
            or not part.shape or is_value(part.numel, 1) or not _plain_part(host):
        return False
    stored = {s.out.buffer: s.out.offset_source(s.index) for s in stores}
    if part.out.buffer in stored:
        return False
    own = {part.out.buffer: part.out.offset_source(part.index)}
    return _same_element(loads([part.body]), stored) and \
        _same_element(loads([s.body for s in stores]), own)


def _same_element(found: list[Load], written: dict[str, str]) -> bool:
    """Whether every load of a buffer in ``written`` (buffer -> the offset its store
    writes) reads at that offset, directly."""
    return all(load.buffer not in written
               or (not load.index_exprs and load.offset == written[load.buffer])
               for load in found)


def _elementwise_reads(kernel: PointwiseKernel) -> set[str]:
    """Buffers a nest reads at the element it stores (its operands, not a broadcast
    scalar such as a learning rate)."""
    return {load.buffer for store in kernel.stores for load in loads([store.body])
            if not load.index_exprs and load.offset == store.out.offset_source(store.index)}


def _plain_part(part: PointwiseKernel) -> bool:
    """A part storing one element per iteration of its own loop, no gather index check (a
    count per iteration must stay one statement, see ``emit.flag_lines``)."""
    return (_joins_pointwise_host(part) and not part.siblings
            and not any(isinstance(node, Op) and node.name == "checked_index"
                        for node in expr_nodes([part.body])))


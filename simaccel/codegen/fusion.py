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

from typing import Any

from simaccel.codegen.ir import PointwiseKernel, ReductionKernel, StructuralKeys

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
    fused: list[Any] = []
    for step in steps:
        host = _pointwise_host(fused, step) if _joins_pointwise(step) else None
        if host is None:
            fused.append(step)
        else:
            host.siblings.append(step)
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

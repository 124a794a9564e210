"""Input write-backs computed in place: the kernel computing an input's new value stores
it into the input's own buffer.

An optimizer step reads each parameter and its state and writes their new values back
(``copy_(p, new)``, :meth:`simaccel.codegen.graph.GraphLowering._input_mutation`).
Computed into a buffer of its own, the new value reaches the caller's tensor but not the
input's device copy, so the next call uploads every parameter again. When the one kernel
computing it reads the input only at the element it stores, and no step after it reads
or writes the input, it may store into the input's buffer instead: that buffer then holds
the new value, read back to the caller, and a resident input's device copy stays current
between calls (:func:`simaccel.input_plan.plan_inputs`). This is the in-place reuse
inductor does for such kernels, decided here on the final (fused) step order.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from simaccel.codegen.ir import PointwiseKernel, ReductionKernel, buffers_read, loads


def inplace_writebacks(steps: Sequence[Any], writebacks: Iterable[tuple[int, Any]],
                       input_buffers: dict[int, str]) -> dict[str, str]:
    """``{new value's buffer: input's buffer}`` for each write-back computed in place.
    ``steps``: the lowered steps in launch order; ``writebacks``: (argument index, new
    value) per mutated input; ``input_buffers``: each argument's buffer."""
    parts = [part for step in steps for part in _parts(step)]
    aliases: dict[str, str] = {}
    for index, value in writebacks:
        target = input_buffers.get(index)
        new = value.layout.buffer
        if target is None or target in aliases.values():
            continue
        touching = [k for k, (_, reads, writes) in enumerate(parts)
                    if new in reads or new in writes]
        writers = [k for k in touching if new in parts[k][2]]
        if len(writers) != 1 or not all(isinstance(parts[k][0], (PointwiseKernel,
                                                                   ReductionKernel))
                                        for k in touching):
            continue  # a host op or a library call names its buffers itself
        k = writers[0]
        kernel = parts[k][0]
        if not _stores_over_its_reads(kernel, target) or any(
                target in reads or target in writes for _, reads, writes in parts[k + 1:]):
            continue
        # the kernel stores into the input itself: one array argument, read and written
        # at the same element, which LLVM vectorizes (two arguments at one address would
        # fail its runtime overlap check and run the scalar loop); the steps after it
        # read the new value through the alias
        kernel.out = dataclasses.replace(kernel.out, buffer=target)
        aliases[new] = target
    return aliases


def _parts(step: Any) -> list[tuple[Any, frozenset[str], frozenset[str]]]:
    """(part, what it reads, what it writes) of a step in the order its parts run (a
    pointwise launch's parts run one after the other; anything else is one part)."""
    if isinstance(step, PointwiseKernel):
        return [(part, _own_reads(part), frozenset({part.out.buffer})) for part in step.parts]
    return [(step, frozenset(step.reads), frozenset(step.writes))]


def _own_reads(part: PointwiseKernel) -> frozenset[str]:
    reads = set(buffers_read([part.body, *part.store_index_exprs]))
    if part.accumulate:
        reads.add(part.out.buffer)
    return frozenset(reads)


def _stores_over_its_reads(kernel: Any, target: str) -> bool:
    """True for a plain pointwise store (no scatter, no accumulation) whose every load of
    ``target`` is of the element it stores: storing into ``target`` then never changes a
    value the kernel still has to read."""
    if not isinstance(kernel, PointwiseKernel) or kernel.store_offset or kernel.accumulate:
        return False
    store = kernel.out.offset_source(kernel.index)
    return all(load.offset == store and not load.index_exprs
               for load in loads([kernel.body]) if load.buffer == target)

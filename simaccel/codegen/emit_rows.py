"""Emit a row kernel (:class:`~simaccel.codegen.ir.RowKernel`) for numba and for tier 0.

The numba form loops over the rows (prange when the work is large enough) and, per row,
runs each stage's loops in turn: a reduction stage's accumulators and stores, a pointwise
stage's loop over the row's elements. Each stage sets its own row variables from the row
number and names its temps apart (``s<k>t<n>``), so stages never share a value across
their loops. The tier-0 form runs the stages one after the other over whole arrays: the
same values, since a stage reads only what earlier stages finished writing.
"""
from __future__ import annotations

from typing import Any

from simaccel.codegen.emit import (PARALLEL_WORK, element_work, kernel_module, loop_nest,
                                   parallel_loop, reduction_body, split_flat)
from simaccel.codegen.emit_pointwise import pointwise_body
from simaccel.codegen.ir import ReductionKernel, RowKernel, buffers_read
from simaccel.codegen.row_reuse import plan_reuse, rewritten_stage
from simaccel.codegen.sizes import hint, source

ROW = "o"


def _bodies(stage: Any) -> list[Any]:
    return [p.body for p in stage.parts]


def row_args(k: RowKernel) -> list[str]:
    """Argument buffers of a row kernel: what it writes (in stage order), then what else
    it reads."""
    outs = list(dict.fromkeys(b for stage in k.stages for b in _writes_in_order(stage)))
    reads = buffers_read([body for stage in k.stages for body in _bodies(stage)])
    return outs + [b for b in reads if b not in outs]


def _writes_in_order(stage: Any) -> list[str]:
    return [p.out.buffer for p in stage.parts]


def row_parallel(k: RowKernel) -> bool:
    """prange over the rows when the stages' work together reaches the bound one kernel
    needs (:func:`simaccel.codegen.emit.parallel_loop`) and there is more than one row."""
    if hint(k.rows) <= 1:
        return False
    work = sum(hint(stage.numel) * element_work(_bodies(stage)) for stage in k.stages)
    return work >= PARALLEL_WORK or any(parallel_loop(stage.numel, _bodies(stage))
                                        for stage in k.stages)


def emit_row(k: RowKernel) -> tuple[str, list[str]]:
    """Module source and argument buffer names of a row kernel."""
    args = row_args(k)
    parallel = row_parallel(k)
    return kernel_module(args, parallel, lambda fast: _row_nest(k, parallel, fast),
                         True), args


def _row_nest(k: RowKernel, parallel: bool, fast_trig: bool) -> tuple[list[str], bool]:
    lines = [f"    for {ROW} in {'prange' if parallel else 'range'}({source(k.rows)}):"]
    indent = "        "
    checked = False
    row_vars: dict[str, str] = {}
    reuse = plan_reuse(k)  # a costly value computed once per element, not per pass
    for n, stage in enumerate(k.stages):
        if n in reuse.dropped:
            continue  # an earlier reduction stage stores its every element
        prefix = f"s{n}"
        stage = rewritten_stage(stage, n, reuse)
        if isinstance(stage, ReductionKernel):
            split = split_flat(ROW, stage.out_index, stage.out_loop_shape, indent)
            body, flag = reduction_body(stage, indent, fast_trig, prefix,
                                        reuse.side_stores.get(n, ()))
        else:
            rows = len(stage.index) - len(k.inner)
            split = split_flat(ROW, stage.index[:rows], stage.shape[:rows], indent)
            loops, inner = loop_nest(stage.index[rows:], stage.shape[rows:], False, indent)
            body, flag = pointwise_body(stage, inner, fast_trig, f"{prefix}t")
            body = loops + body
        lines += _new_assignments(split, row_vars) + body
        checked = checked or flag
    return lines, checked


def _new_assignments(split: list[str], row_vars: dict[str, str]) -> list[str]:
    """The lines of ``split`` that change a row variable (numba's prange rejects a second
    ``o0 = o``: it reads as overwriting the loop index)."""
    new = []
    for line in split:
        var, _, value = line.strip().partition(" = ")
        if row_vars.get(var) != value:
            row_vars[var] = value
            new.append(line)
    return new

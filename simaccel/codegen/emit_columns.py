"""Column reductions: a reduction over a dimension outside the one its input is
contiguous along (a bias gradient, ``g.sum(0)`` of a (tokens, features) gradient; a
layer norm's weight gradient).

The plain reduction nest (:func:`simaccel.codegen.emit.emit_reduction`) loops over the
outputs and, per output, over the reduced elements: here that walks each input down a
column, one element per row. At a power-of-two row pitch every one of those loads maps to
the same few cache sets, so each misses L1 (measured: the bias gradients of a 64x512
ReLU layer, two column sums, 202 us; 64x512 elements want ~5 us). A column reduction
instead keeps a chunk of accumulators, one per output, and walks the rows in order, each
row's chunk of elements contiguous (vectorized across the outputs).

Each output then adds its elements one after the other, where a row reduction's
vectorized loop keeps a partial sum per lane and eager a cascade of partial sums: a
float32 column sum accumulates in float64, so its error stays below eager's (measured
over 256 rows of ~1000: float32 accumulators erred 4x more than eager;
``tests/codegen/test_column_reductions.py``). The accumulators are vectorized across the
outputs either way.
"""
from __future__ import annotations

from simaccel.codegen.emit import (BodyEmitter, accumulator_slot, accumulators, combine_source,
                                   dtype_ctor, index_source, kernel_module, loop_nest,
                                   parallel_loop, reduce_init, split_flat, store_source)
from simaccel.codegen.ir import ReductionKernel, buffers_read, loads
from simaccel.codegen.sizes import CALL, SYMBOL_NAME, hint, prod, source

#: outputs per chunk: one accumulator each (256 float64 accumulators are 2 KiB: L1)
CHUNK = 256
#: the fewest outputs along the contiguous dimension worth the column order
MIN_COLUMNS = 16
#: the value a size symbol stands for when the order is chosen (a heuristic: any order
#: computes the same reduction, so no guard)
_SYMBOL_STAND_IN = 97
#: the chunk loop's variables (emitted names apart from the index names ``o<k>``, ``r<k>``)
_CHUNK, _LOW, _COUNT, _LANE = "oc", "olo", "on", "oj"


def column_order(k: ReductionKernel) -> bool:
    """True if ``k`` is a column reduction: every load steps by 0 or 1 element along the
    innermost output index and at least one steps by 1 while moving by more than one
    element along the innermost reduced index (none moving by exactly one: a row
    reduction's order is right). Offsets without indirect loads or calls qualify (a size
    symbol counted as :data:`_SYMBOL_STAND_IN`); argmax and argmin keep the plain nest."""
    if k.reduce_op in ("argmax", "argmin") or not k.out_index or not k.red_index:
        return False
    if hint(k.out_loop_shape[-1]) < MIN_COLUMNS:
        return False
    names = (*k.out_index, *k.red_index)
    column, reduced = k.out_index[-1], k.red_index[-1]
    found = False
    for load in loads([p.body for p in k.parts]):
        if load.index_exprs:
            return False
        steps = _steps(load.offset, names, column, reduced)
        if steps is None or steps[0] not in (0, 1) or steps[1] == 1:
            return False
        found = found or (steps[0] == 1 and steps[1] != 0)
    return found


def _steps(offset: str, names: tuple[str, ...], column: str, reduced: str
           ) -> tuple[int, int] | None:
    """How many elements ``offset`` moves when ``column``, then ``reduced``, goes from 0
    to 1 (every other index at 0); None for an offset with a call."""
    if CALL.search(offset):
        return None
    zero = {name: 0 for name in names}
    zero.update((name, _SYMBOL_STAND_IN) for name in SYMBOL_NAME.findall(offset))
    try:
        base = int(eval(offset, {"__builtins__": {}}, zero))  # noqa: S307
        return (int(eval(offset, {"__builtins__": {}}, {**zero, column: 1})) - base,  # noqa: S307
                int(eval(offset, {"__builtins__": {}}, {**zero, reduced: 1})) - base)  # noqa: S307
    except (NameError, SyntaxError, TypeError, ZeroDivisionError):
        return None


def emit_column_reduction(k: ReductionKernel) -> tuple[str, list[str]]:
    """Module source and argument buffer names of column reduction ``k``
    (:func:`column_order`) and its fused siblings, the arguments in
    :func:`~simaccel.codegen.emit.emit_reduction`'s order. The chunks run in a prange
    when the work is large enough and there are at least two."""
    outs = [p.out.buffer for p in k.parts]
    reads = buffers_read([p.body for p in k.parts])
    args = outs + [b for b in reads if b not in outs]
    parallel = parallel_loop(k.numel, [p.body for p in k.parts]) \
        and hint(k.out.numel) > CHUNK
    rerunnable = not set(outs) & set(reads)
    return kernel_module(args, parallel, lambda fast: _column_nest(k, parallel, fast),
                         rerunnable), args


def _column_nest(k: ReductionKernel, parallel: bool, fast_trig: bool
                 ) -> tuple[list[str], bool]:
    """The loops: per chunk of the innermost output dimension (and position in the outer
    ones), the accumulators set, the reduced loops around a loop over the chunk, the
    stores."""
    outer, outer_shape = k.out_index[:-1], k.out_loop_shape[:-1]
    column, columns = k.out_index[-1], source(k.out_loop_shape[-1])
    chunks = f"((({columns}) + {CHUNK - 1}) // {CHUNK})"
    loop = "prange" if parallel else "range"
    ind = "        "
    lines = [f"    for {_CHUNK} in {loop}(({source(prod(outer_shape))}) * {chunks}):",
             f"{ind}{_LOW} = ({_CHUNK} % {chunks}) * {CHUNK}",
             f"{ind}{_COUNT} = min({CHUNK}, {columns} - {_LOW})"]
    if outer:
        lines += split_flat(f"({_CHUNK} // {chunks})", list(outer), outer_shape, ind)
    red_lines, red_indent = loop_nest(k.red_index, k.red_shape, False, ind)
    inner = red_indent + "    "
    body = BodyEmitter(inner, fast_trig)
    acc_of = accumulators(k.parts, body.keys)
    combine: list[str] = []
    for part, acc in acc_of.values():
        acc_dtype = "float64" if part.reduce_op == "sum" and part.acc_dtype == "float32" \
            else part.acc_dtype
        lines += [f"{ind}{acc} = np.empty({_COUNT}, {_array_dtype(acc_dtype)})",
                  f"{ind}for {_LANE} in range({_COUNT}):",
                  f"{ind}    {acc}[{_LANE}] = {reduce_init(part.reduce_op, acc_dtype)}"]
        value = body.value(part.body)
        combine += [inner + line for line in combine_source(
            part.reduce_op, value, dtype_ctor(acc_dtype), f"{acc}[{_LANE}]")]
    lines += red_lines + [f"{red_indent}for {_LANE} in range({_COUNT}):",
                          f"{inner}{column} = {_LOW} + {_LANE}"]
    lines += body.lines + body.flag_lines() + combine
    lines += [f"{ind}for {_LANE} in range({_COUNT}):",
              f"{ind}    {column} = {_LOW} + {_LANE}"]
    for part in k.parts:
        acc = acc_of[accumulator_slot(part, body.keys)][1] + f"[{_LANE}]"
        result = part.finalize.format(acc=acc) if part.finalize else acc
        value = store_source(f"{dtype_ctor(part.out_dtype)}({result})", part.out_dtype)
        lines.append(f"{ind}    {part.out.buffer}[{index_source(part.out_offset_src)}] = {value}")
    return lines, body.range_checked


def _array_dtype(acc_dtype: str) -> str:
    """The numpy dtype source of an accumulator array."""
    return "np.bool_" if acc_dtype == "bool" else dtype_ctor(acc_dtype)

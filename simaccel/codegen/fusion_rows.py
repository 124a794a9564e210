"""Row fusion: a reduction and the kernels that consume it row by row, as one kernel.

A softmax lowers to a max over each row, a sum of ``exp(x - max)`` over each row and a
pointwise ``exp(x - max) / sum``; a layer norm to a mean, a variance and the
normalisation. As separate kernels each one streams the whole tensor from memory; fused
into a :class:`~simaccel.codegen.ir.RowKernel`, a row's passes run back to back and the
later ones find the row in cache (what inductor calls a persistent reduction).

A kernel joins a row kernel when

* its iteration space is the row kernel's rows x inner elements: a reduction over the
  same rows and reduced extent, or a pointwise kernel whose trailing dims are the reduced
  extent and whose leading dims hold as many elements as there are rows;
* it reads what the row kernel writes in its own row only: a per-row value (a reduction's
  output) at its row's element, a per-element value at its own element; both are checked
  on the affine offsets (:func:`flat_offset`);
* it writes nothing the row kernel reads or writes, nor anything it reads itself;
* it can move up to the row kernel past the steps in between (they neither write what it
  reads nor touch what it writes), at most :data:`MAX_ROW_MOVE` of them.

A pointwise kernel whose output the next reduction reads in its own row starts a row
kernel too (the masked scores of an attention softmax). Rows are independent, so a row
kernel runs its rows in parallel like any reduction.
"""
from __future__ import annotations

import ast
import functools
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy

from simaccel.codegen.fusion import FUSABLE_OPS, can_move_above
from simaccel.codegen.ir import (PointwiseKernel, ReductionKernel, RowKernel,
                                 contiguous_strides, loads)
from simaccel.codegen.sizes import CALL, SYMBOL_NAME, hint, prod, source

#: most steps a kernel moves up to join a row kernel (its inputs then live longer)
MAX_ROW_MOVE = 4
#: most elements of one row: a row is meant to stay in cache between its passes
#: (64K float32 = 256 KB, a core's L2)
MAX_ROW_ELEMENTS = 1 << 16

_NAME = re.compile(r"[A-Za-z_]\w*")


#: most positions :func:`flat_offset` evaluates for a static offset
MAX_CHECKED_POSITIONS = 1 << 22


@functools.lru_cache(maxsize=8192)
def flat_offset(offset: str, names: tuple[str, ...], shape: tuple[str, ...]
                ) -> tuple[str, str] | None:
    """``(base, step)`` if ``offset``, an index expression over the loop variables
    ``names`` (extents ``shape``, as size sources), is ``base + step * flat`` where
    ``flat`` is the row-major position of the variables in ``shape``; None if it is not
    (a function call, a variable out of step, another loop variable). Two accesses with
    equal results touch the same element at the same flat position. A static offset is
    evaluated exactly: per variable when it is a sum of one-variable terms
    (``(i0 // 8)*1024 + (i0 % 8)*128`` is ``i0*128``), else at every position; one over
    size symbols must be affine in the variables once ``x % n`` is ``x - n*(x // n)``."""
    if CALL.search(offset) or any(CALL.search(s) for s in shape):
        return None
    if any(SYMBOL_NAME.search(text) for text in (offset, *shape)):
        return _symbolic_flat(offset, names, shape)
    extents = tuple(int(s) for s in shape)
    if _separable(offset, names):
        return _separable_flat(offset, names, extents)
    return _static_flat(offset, names, extents)


def _terms(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _terms(node.left) + _terms(node.right)
    return [node]


def _separable(offset: str, names: tuple[str, ...]) -> bool:
    """True if ``offset`` is a sum of terms that each read at most one of ``names`` (and
    nothing else): then it is a constant plus one function per variable."""
    try:
        tree = ast.parse(offset, mode="eval").body
    except SyntaxError:
        return False
    for term in _terms(tree):
        used = {n.id for n in ast.walk(term) if isinstance(n, ast.Name)}
        if len(used) > 1 or used - set(names):
            return False
    return True


def _separable_flat(offset: str, names: tuple[str, ...], shape: tuple[int, ...]
                    ) -> tuple[str, str] | None:
    """:func:`flat_offset` of a separable static offset: each variable's own term is
    checked over its whole range, the others at 0 (exact for a sum of one-variable
    terms: ``(i0 // 8)*1024 + (i0 % 8)*128`` is one term pair of ``i0``)."""
    if 0 in shape:
        return None
    zero = {name: 0 for name in names}
    base = int(eval(offset, {"__builtins__": {}}, zero))  # noqa: S307
    step = None
    for name, extent, stride in zip(names, shape, contiguous_strides(shape)):
        if extent == 1:
            continue
        values = np.arange(extent, dtype=np.int64)
        term = np.broadcast_to(eval(offset, {"__builtins__": {}},  # noqa: S307
                                    {**zero, name: values}), (extent,)) - base
        if step is None:
            step, rest = divmod(int(term[1]), stride)
            if rest:
                return None
        if not np.array_equal(term, step * stride * values):
            return None
    return str(base), str(step if step is not None else 0)


def loop_positions(offset: str, names: tuple[str, ...], shape: tuple[int, ...]
                   ) -> np.ndarray | None:
    """The element ``offset`` reads at every position of the loop over ``names``
    (static extents ``shape``), in row-major order (int64); None past
    :data:`MAX_CHECKED_POSITIONS` positions or when ``offset`` names anything else."""
    count = math.prod(shape)
    if not 0 < count <= MAX_CHECKED_POSITIONS or set(_NAME.findall(offset)) - set(names):
        return None
    grid = {name: np.arange(n, dtype=np.int64).reshape(
        [n if d == k else 1 for d in range(len(shape))]) for k, (name, n) in
        enumerate(zip(names, shape))}
    return np.broadcast_to(eval(offset, {"__builtins__": {}}, grid),  # noqa: S307
                           shape).reshape(-1)


def _static_flat(offset: str, names: tuple[str, ...], shape: tuple[int, ...]
                 ) -> tuple[str, str] | None:
    values = loop_positions(offset, names, shape)
    if values is None:
        return None
    count = values.size
    base = int(values[0])
    step = int(values[1] - values[0]) if count > 1 else 0
    if not np.array_equal(values, base + step * np.arange(count, dtype=np.int64)):
        return None
    return str(base), str(step)


def _symbolic_flat(offset: str, names: tuple[str, ...], shape: tuple[str, ...]
                   ) -> tuple[str, str] | None:
    symbols = {name: sympy.Symbol(name, integer=True)
               for text in (offset, *shape) for name in _NAME.findall(text)}
    loop_vars = [symbols.get(name, sympy.Symbol(name, integer=True)) for name in names]
    # a collapsed dim reads ``(i0 // n)*a + (i0 % n)*b``: with ``x % n = x - n*(x // n)``
    # the floors cancel when the access is in step, and any that stay reject it
    expr = sympy.sympify(offset, locals=symbols).replace(
        lambda e: isinstance(e, sympy.Mod),
        lambda e: e.args[0] - e.args[1] * sympy.floor(e.args[0] / e.args[1]))
    expr = sympy.expand(expr)
    if any(f.free_symbols & set(loop_vars) for f in expr.atoms(sympy.Function)):
        return None
    if any(str(s) not in names and not SYMBOL_NAME.fullmatch(str(s))
           for s in expr.free_symbols):
        return None  # another loop variable (the reduced index of a per-row read)
    extents = [sympy.sympify(s, locals=symbols) for s in shape]
    step = None
    strides = [sympy.Mul(*extents[k + 1:]) for k in range(len(extents))]
    for var, extent, stride in zip(loop_vars, extents, strides):
        coeff = sympy.expand(expr.diff(var))
        if coeff.free_symbols & set(loop_vars):
            return None
        if extent == 1:
            continue  # the variable is always 0
        if step is None:
            step = sympy.simplify(coeff / stride)
        elif sympy.expand(coeff - step * stride) != 0:
            return None
    base = expr.subs({var: 0 for var in loop_vars})
    return str(sympy.expand(base)), str(step if step is not None else 0)


@dataclass(frozen=True)
class _Geometry:
    """A stage's loop variables split into the row part and the in-row part."""

    outer: tuple[str, ...]
    outer_shape: tuple[str, ...]
    inner: tuple[str, ...]
    inner_shape: tuple[str, ...]

    def row_read(self, offset: str) -> tuple[str, str] | None:
        return flat_offset(offset, self.outer, self.outer_shape)

    def element(self, offset: str) -> tuple[str, str] | None:
        return flat_offset(offset, self.outer + self.inner, self.outer_shape + self.inner_shape)


def sources(shape: tuple) -> tuple[str, ...]:
    return tuple(source(s) for s in shape)


def reduction_geometry(k: ReductionKernel) -> _Geometry:
    return _Geometry(tuple(k.out_index), sources(k.out_loop_shape), tuple(k.red_index),
                     sources(k.red_shape))


def pointwise_geometry(k: PointwiseKernel, rows: str, inner: tuple[str, ...]
                        ) -> _Geometry | None:
    """``k``'s loop split into ``rows`` rows of the ``inner`` extent, or None."""
    n = len(inner)
    shape = sources(k.shape)
    if len(shape) <= n or shape[len(shape) - n:] != inner or \
            source(prod(k.shape[:len(shape) - n])) != rows:
        return None
    return _Geometry(tuple(k.index[:-n]), shape[:-n], tuple(k.index[-n:]), inner)


def joins_as_pointwise(step: Any) -> bool:
    return isinstance(step, PointwiseKernel) and not step.siblings and \
        not step.store_offset and not step.accumulate and step.iter_shape is None


def _joins_as_reduction(step: Any) -> bool:
    return isinstance(step, ReductionKernel) and bool(step.red_index) and \
        all(part.reduce_op in FUSABLE_OPS for part in step.parts)


def _row_shape(k: ReductionKernel) -> tuple[str, tuple[str, ...]]:
    return source(prod(k.out_loop_shape)), sources(k.red_shape)


class _Row:
    """A row kernel being built: its stages and what each buffer it writes holds."""

    def __init__(self, rows: str, inner: tuple[str, ...], row_count: int):
        self.rows, self.inner, self.row_count = rows, inner, row_count
        self.stages: list[Any] = []
        #: buffer -> ("row" | "element", flat offset of its store)
        self.written: dict[str, tuple[str, tuple[str, str]]] = {}
        self.reads: set[str] = set()

    def geometry(self, step: Any) -> _Geometry | None:
        if isinstance(step, ReductionKernel):
            return reduction_geometry(step) if _row_shape(step) == (self.rows, self.inner) \
                else None
        return pointwise_geometry(step, self.rows, self.inner)

    def try_add(self, step: Any) -> bool:
        """Add ``step`` as the next stage if it keeps rows independent."""
        geo = self.geometry(step)
        if geo is None or step.writes & (self.reads | set(self.written)) or \
                step.writes & step.reads:
            return False
        stores = self._stores(step, geo)
        if stores is None or not self._reads_in_row(step, geo):
            return False
        self.stages.append(step)
        self.written.update(stores)
        self.reads |= step.reads
        return True

    def _stores(self, step: Any, geo: _Geometry) -> dict | None:
        """Where ``step`` stores, per buffer; None if a store is not one element per
        position (rows written in parallel must not overlap)."""
        if isinstance(step, ReductionKernel):
            found = {p.out.buffer: ("row", geo.row_read(p.out_offset_src)) for p in step.parts}
        else:
            found = {step.out.buffer: ("element", geo.element(step.out.offset_source(step.index)))}
        if any(flat is None or (flat[1] == "0" and self.row_count > 1)
               for _, flat in found.values()):
            return None
        return found

    def _reads_in_row(self, step: Any, geo: _Geometry) -> bool:
        bodies = [p.body for p in step.parts]
        for load in loads(bodies):
            held = self.written.get(load.buffer)
            if held is None:
                continue
            if load.index_exprs:
                return False
            kind, flat = held
            found = geo.row_read(load.offset) if kind == "row" else geo.element(load.offset)
            if found != flat:
                return False
        return True

    def uses(self, step: Any) -> bool:
        """True if ``step`` reads something the row kernel writes (else fusing it gains
        nothing)."""
        return bool(step.reads & set(self.written))

    def kernel(self) -> RowKernel:
        name = "row_" + "_".join(s.name.split("_", 2)[-1] for s in self.stages)
        first = _first_reduction(self.stages)
        return RowKernel(name, prod(first.out_loop_shape), tuple(first.red_shape),
                         list(self.stages))


def _first_reduction(stages: list[Any]) -> ReductionKernel:
    return next(s for s in stages if isinstance(s, ReductionKernel))


def _joined(host: Any, step: Any) -> RowKernel | None:
    """The row kernel of ``host`` (a reduction, a row kernel, or a pointwise kernel whose
    output the reduction ``step`` reads) with ``step`` as its next stage, or None."""
    if isinstance(host, RowKernel) or _joins_as_reduction(host):
        stages = host.stages if isinstance(host, RowKernel) else [host]
        reduction = _first_reduction(stages)
    elif joins_as_pointwise(host) and _joins_as_reduction(step):
        stages, reduction = [host], step
    else:
        return None
    if hint(prod(reduction.red_shape)) > MAX_ROW_ELEMENTS:
        return None
    row = _Row(*_row_shape(reduction), hint(prod(reduction.out_loop_shape)))
    if not all(row.try_add(stage) for stage in stages):
        return None
    if not row.uses(step) or not row.try_add(step):
        return None
    return row.kernel()


def _fusion_target(fused: list[Any], step: Any) -> tuple[int, RowKernel] | None:
    """(position in ``fused``, the row kernel) that ``step`` forms with the nearest
    earlier step it can join, or None."""
    for back in range(1, min(MAX_ROW_MOVE, len(fused)) + 1):
        position = len(fused) - back
        if not all(can_move_above(step, other) for other in fused[position + 1:]):
            return None
        row = _joined(fused[position], step)
        if row is not None:
            return position, row
    return None


def fuse_rows(steps: list[Any]) -> list[Any]:
    """``steps`` with each reduction, and each pointwise kernel consuming one row by row,
    folded into a row kernel with an earlier step it can join (see the module doc)."""
    fused: list[Any] = []
    for step in steps:
        target = _fusion_target(fused, step) \
            if _joins_as_reduction(step) or joins_as_pointwise(step) else None
        if target is None:
            fused.append(step)
        else:
            fused[target[0]] = target[1]
    return fused

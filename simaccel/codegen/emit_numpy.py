"""Emit kernel IR as whole-array numpy source: the tier-0 form of a kernel.

A tier-0 kernel runs the moment its graph is lowered, while numba compiles the same IR in
the background (:mod:`.tiered`). It has the numba kernel's exact signature (flat buffers,
then the size bank and slots), and evaluates each IR node once over the whole iteration
space: a loop variable becomes an index grid (``np.arange`` along its own axis), a load a
gather, a store a scatter, a reduction a numpy reduction over the trailing axes.

The scalar sources the numba emitter renders are reused and rewritten for arrays
(:func:`vectorized`): ``a if c else b`` becomes a select, ``and``/``or``/``not`` logical
ufuncs, ``min``/``max`` elementwise ones, and every numeric literal a typed numpy scalar
(numba types ``2`` as int64 and ``1.0`` as float64, so ``float32 * 2`` is a float64 there;
numpy would keep a bare literal "weak" and compute in float32). Helpers come from
:mod:`.numpy_lib`. A kernel this form cannot reproduce (a template, a helper without an
array twin, a 16-bit accumulate-scatter) raises :class:`Unsupported` and simply waits for
its compiled version.
"""
from __future__ import annotations

import ast
import functools
import keyword
import re

from simaccel.codegen import numpy_lib
from simaccel.codegen import scalar_ops
from simaccel.codegen.dtypes import HALF_DTYPES, compute_dtype
from simaccel.codegen.emit import (BodyEmitter, accumulator_slot, accumulators, dtype_ctor,
                                   has_fast_trig, kernel_args, reduce_init, store_source)
from simaccel.codegen.emit_pointwise import shared_nest_args
from simaccel.codegen.emit_rows import row_args
from simaccel.codegen.ir import (ExternKernel, Op, PointwiseKernel, ReductionKernel, RowKernel,
                                 buffers_read)
from simaccel.codegen.sizes import source

_INT64 = (-(1 << 63), (1 << 63) - 1)
_LIB_CALLS = {"min": "lib.smaller", "max": "lib.larger", "bool": "lib.to_bool"}
#: numpy functions the numba kernels call libm for, by their C names: tier 0 calls the
#: same C function (numpy_lib.libm), since numpy's own SIMD versions round differently
_LIBM_NAMES = {"exp": "exp", "log": "log", "log1p": "log1p", "expm1": "expm1", "sin": "sin",
               "cos": "cos", "tan": "tan", "tanh": "tanh", "arcsin": "asin",
               "arccos": "acos", "arctan": "atan", "sinh": "sinh", "cosh": "cosh",
               "log2": "log2", "log10": "log10", "exp2": "exp2", "arctan2": "atan2",
               "power": "pow"}


class Unsupported(Exception):
    """The kernel has no tier-0 form; the reason is the message."""


class _ForArrays(ast.NodeTransformer):
    """Rewrites scalar kernel source for whole arrays (see the module doc)."""

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return node
        if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
            return node
        ctor = "float64" if isinstance(value, float) else "int64"
        return _call(f"np.{ctor}", [node])

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        return _call("lib.where", [node.test, node.body, node.orelse])

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        name = "lib.logical_and" if isinstance(node.op, ast.And) else "lib.logical_or"
        return _call(name, node.values)

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        # a chained comparison is an ``and`` of its links, which arrays cannot take
        # (kernel expressions are pure: the middle operands are evaluated twice)
        self.generic_visit(node)
        if len(node.ops) == 1:
            return node
        operands = [node.left, *node.comparators]
        return _call("lib.logical_and", [ast.Compare(left, [op], [right]) for left, op, right
                                         in zip(operands, node.ops, operands[1:])])

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            return _call("lib.logical_not", [node.operand])
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in _LIB_CALLS:
            return _call(_LIB_CALLS[node.func.id], node.args)
        if isinstance(node.func, ast.Attribute) and _root(node.func) == "np" \
                and node.func.attr in _LIBM_NAMES:
            name = ast.Constant(_LIBM_NAMES[node.func.attr])
            return _call("lib.libm", [name, *node.args])
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Pow):
            return _call("lib.power", [node.left, node.right])
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "lib" \
                and not hasattr(numpy_lib, node.attr):
            raise Unsupported(f"helper lib.{node.attr} has no array form")
        if isinstance(node.value, ast.Attribute) and _root(node.value) == "lib" \
                or _root(node) == "math":
            raise Unsupported(f"helper {ast.unparse(node)} has no array form")
        return node


def _root(node: ast.AST) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _call(name: str, args: list[ast.expr]) -> ast.Call:
    func: ast.expr = ast.Name(name.split(".")[0], ast.Load())
    for part in name.split(".")[1:]:
        func = ast.Attribute(func, part, ast.Load())
    return ast.Call(func, list(args), [])


#: a name the rewrite treats as opaque: not an attribute, not one it acts on (:data:`_KEEP`)
_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
_KEEP = frozenset(keyword.kwlist) | {"np", "lib", "math", *_LIB_CALLS}
_PLACEHOLDER = re.compile(r"\b_v\d+\b")


def vectorized(src: str) -> str:
    """``src`` (a scalar kernel expression) rewritten for whole arrays. The rewrite of
    the expression with its opaque names (buffers, temporaries, loop variables) numbered
    in order of appearance is shared: a GPT-2 graph's 1086 expressions are 330 distinct
    ones but 71 shapes, and each rewrite parses and unparses the expression (~0.15 ms)."""
    if "_v" in src:  # a name that could be taken for a placeholder: rewrite it as it is
        return _vectorized_shape(src)
    names: dict[str, str] = {}

    def hide(match: re.Match[str]) -> str:
        name = match.group(0)
        return name if name in _KEEP else names.setdefault(name, f"_v{len(names)}")

    rewritten = _vectorized_shape(_NAME.sub(hide, src))
    if not names:
        return rewritten
    back = {placeholder: name for name, placeholder in names.items()}
    return _PLACEHOLDER.sub(lambda match: back[match.group(0)], rewritten)


@functools.lru_cache(maxsize=65536)
def _vectorized_shape(src: str) -> str:
    tree = _ForArrays().visit(ast.parse(src, mode="eval"))
    return ast.unparse(ast.fix_missing_locations(tree))


class ArrayBodyEmitter(BodyEmitter):
    """:class:`BodyEmitter` whose statements compute whole arrays."""

    def __init__(self, indent: str, prefix: str = "t"):
        super().__init__(indent, fast_trig=False, prefix=prefix)

    def _new(self, src: str) -> str:
        return super()._new(vectorized(src))

    def _emit(self, expr):
        if isinstance(expr, Op) and expr.name == "checked_index":  # raises at once
            index, size = (self.value(a) for a in expr.args)
            return self._new(f"lib.checked_index({index}, {size})")
        if isinstance(expr, Op) and expr.name == "fma" and expr.dtype == "float64":
            raise Unsupported("a float64 fused multiply-add cannot be rounded once in numpy")
        if isinstance(expr, Op) and has_fast_trig(expr):
            # the numba kernel's fast polynomial, with its exact rerun built in
            arg = self.value(expr.args[0])
            return self._new(f"np.float32({scalar_ops.RANGE_CHECKED[expr.name]}({arg}))")
        return super()._emit(expr)


def _grids(index: list[str], shape: tuple, first_axis: int, ndim: int) -> list[str]:
    """One index grid per loop variable, each along its own axis of ``ndim``."""
    return [f"    {var} = lib.axis({source(size)}, {first_axis + k}, {ndim})"
            for k, (var, size) in enumerate(zip(index, shape))]


def _shape_source(shape: tuple) -> str:
    return "(" + "".join(f"{source(s)}, " for s in shape) + ")"


def emit_numpy_pointwise(k: PointwiseKernel) -> str:
    """Module source of the tier-0 form of one pointwise (or scatter) kernel part."""
    if k.accumulate and k.body.dtype in HALF_DTYPES:
        raise Unsupported("a 16-bit accumulating scatter rounds per element, in order")
    if k.mates:
        return _numpy_shared_nest(k)
    args = kernel_args(k.out.buffer, [k.body, *k.store_index_exprs])
    lines = [f"def kernel({', '.join(args)}):"] + _grids(k.index, k.shape, 0, len(k.shape))
    body = ArrayBodyEmitter("    ")
    result = body.value(k.body)
    shape = _shape_source(k.shape)
    if k.store_offset:
        idx = [f"np.int64({body.value(e)})" for e in k.store_index_exprs]
        offset = vectorized(k.store_offset.format(*idx))
        store = (f"    lib.scatter({k.out.buffer}, np.uint64({offset}), {result}, {shape}, "
                 f"{k.accumulate})")
    else:
        store = _array_store(k, result, shape)
    return _module(lines + body.lines + [store])


def _numpy_shared_nest(k: PointwiseKernel) -> str:
    """The tier-0 form of a pointwise part and its mates (:attr:`PointwiseKernel.mates`):
    each store's whole array in turn, a later one reading what an earlier one stored."""
    lines = [f"def kernel({', '.join(shared_nest_args(k))}):"] + \
        _grids(k.index, k.shape, 0, len(k.shape))
    shape = _shape_source(k.shape)
    for j, store in enumerate(k.stores):
        body = ArrayBodyEmitter("    ", prefix=f"s{j}t")
        lines += body.lines + [_array_store(store, body.value(store.body), shape)]
    return _module(lines)


def _array_store(k: PointwiseKernel, result: str, shape: str) -> str:
    """The statement storing array ``result`` at every element of ``k``'s output."""
    offset = vectorized(k.out.offset_source(k.index))
    value = vectorized(store_source(result, k.body.dtype))
    return f"    lib.store({k.out.buffer}, np.uint64({offset}), {value}, {shape})"


def emit_numpy_reduction(k: ReductionKernel) -> str:
    """Module source of the tier-0 form of a reduction and its fused siblings."""
    outs = [p.out.buffer for p in k.parts]
    reads = buffers_read([p.body for p in k.parts])
    args = outs + [b for b in reads if b not in outs]
    n_out, n_red = len(k.out_index), len(k.red_index)
    ndim = n_out + n_red
    lines = [f"def kernel({', '.join(args)}):"]
    lines += _grids(k.out_index, k.out_loop_shape, 0, ndim)
    lines += _grids(k.red_index, k.red_shape, n_out, ndim)
    full = _shape_source((*k.out_loop_shape, *k.red_shape))
    kept = _shape_source((*k.out_loop_shape, *(1,) * n_red))
    body = ArrayBodyEmitter("    ")
    acc_of = accumulators(k.parts, body.keys)
    folds: list[str] = []
    for part, acc in acc_of.values():
        value = body.value(part.body)
        init = vectorized(reduce_init(part.reduce_op, part.acc_dtype))
        folds.append(f"    {acc} = lib.fold({part.reduce_op!r}, {value}, {full}, {n_red}, "
                     f"np.{compute_dtype(part.acc_dtype)}, {init})")
    stores = []
    for part in k.parts:
        acc = acc_of[accumulator_slot(part, body.keys)][1]
        is_arg = part.reduce_op in ("argmax", "argmin")
        result = acc if is_arg or not part.finalize else part.finalize.format(acc=acc)
        out_dtype = "int64" if is_arg else part.out_dtype
        value = vectorized(store_source(f"{dtype_ctor(out_dtype)}({result})", out_dtype))
        offset = vectorized(part.out_offset_src)
        stores.append(f"    lib.store({part.out.buffer}, np.uint64({offset}), {value}, {kept})")
    return _module(lines + body.lines + folds + stores)


def emit_numpy_row(k: RowKernel) -> str:
    """Module source of the tier-0 form of a row kernel: its stages one after the other,
    each over all rows (a stage reads only what the earlier ones finished writing)."""
    lines = [f"def kernel({', '.join(row_args(k))}):"]
    for stage in k.stages:
        single = emit_numpy_reduction(stage) if isinstance(stage, ReductionKernel) \
            else emit_numpy_pointwise(stage)
        lines += single.splitlines()[1:]  # the statements, not the def line
    return _module(lines)


def _module(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def emit_numpy(kernel) -> str:
    """The tier-0 source of ``kernel``; raises :class:`Unsupported` if it has none."""
    if isinstance(kernel, PointwiseKernel):
        if kernel.siblings:
            raise ValueError(f"{kernel.name}: emit each part of a fused launch on its own")
        return emit_numpy_pointwise(kernel)
    if isinstance(kernel, ReductionKernel):
        return emit_numpy_reduction(kernel)
    if isinstance(kernel, RowKernel):
        return emit_numpy_row(kernel)
    if isinstance(kernel, ExternKernel) and kernel.numpy_source is not None:
        return kernel.numpy_source
    raise Unsupported(f"{type(kernel).__name__} is a hand-written template")

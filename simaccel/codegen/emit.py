"""Emit kernel IR as Python source for ``numba.njit``.

Every kernel becomes one function ``kernel(<flat buffers...>)`` in its own module.
Buffers are 1-D arrays (flat views of device memory); static shapes, strides and offsets
appear as literals, so LLVM can vectorise the inner loops; dynamic ones are expressions
over size symbols, which :func:`simaccel.codegen.compile.jit_kernel` makes arguments. The same
source runs as plain Python under ``NUMBA_DISABLE_JIT=1``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from simaccel.codegen import scalar_ops
from simaccel.codegen.dtypes import HALF_DTYPES, compute_dtype, is_float
from simaccel.codegen.hoist import hoist_invariants, hoist_out_of_loops
from simaccel.codegen.lib_version import HELPERS_DIGEST
from simaccel.codegen.ir import (Const, Expr, ExternKernel, IndexValue, Load, Op,
                                 ReductionKernel, StructuralKeys, buffers_read,
                                 contiguous_strides)
from simaccel.codegen.sizes import SIZE_FUNCTION_NAMES, hint, is_value, prod, source

#: the kernel_lib helpers (:mod:`simaccel.codegen.half_lib`) that load 16-bit float bits as
#: float32 and round float32 into them (named here: emitting source imports no numba).
HALF_LOAD = {"bfloat16": "lib.bf16_load", "float16": "lib.f16_load"}
HALF_STORE = {"bfloat16": "lib.bf16_store", "float16": "lib.f16_store"}

#: A kernel runs its outer loop with prange (numba's threads) when its iteration space
#: reaches :data:`PARALLEL_THRESHOLD` elements, or its iteration space times its work per
#: element reaches this (in "adds"; see :func:`element_work`). Measured on the 2-core
#: machine (notes on issue 16): at 131K-262K elements parallel adds and row sums took up
#: to 2x longer, so a cheap kernel needs 512K elements (work 2). A kernel with
#: transcendentals wins from ~64K elements: on the GPT-2 forward (same process, serial
#: and prange builds timed in alternating rounds) its masked softmax rows (32K elements,
#: exp) and tanh-GELU (64K) in prange made the whole call 0.90-0.96x as long idle and
#: 0.86-0.94x with a busy loop on the other core (session 19; an earlier bound of 8M
#: kept them serial).
PARALLEL_WORK = 1 << 20
#: work of one transcendental scalar op (exp, log, tanh, erf, sin, pow...) in adds:
#: the vectorised float32 polynomials cost ~10-20 multiply-adds
COSTLY_OP_WORK = 16
COSTLY_OPS = frozenset({
    "exp", "log", "log1p", "expm1", "sin", "cos", "tan", "tanh", "asin", "acos", "atan",
    "sinh", "cosh", "log2", "log10", "exp2", "sigmoid", "erf", "erfc", "erfinv", "pow",
    "atan2", "lgamma", "digamma"})
#: iteration spaces of at least this many elements run with prange whatever they compute
PARALLEL_THRESHOLD = 1 << 20


def element_work(exprs: list[Expr]) -> int:
    """Work per element of a kernel computing ``exprs`` (in adds): 1 for its loads and
    store, 1 per distinct scalar op, :data:`COSTLY_OP_WORK` per transcendental one."""
    seen: set[int] = set()
    stack = list(exprs)
    work = 1
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Op):
            work += COSTLY_OP_WORK if node.name in COSTLY_OPS else 1
        stack.extend(node.children())
    return work


def parallel_loop(numel: Any, exprs: list[Expr]) -> bool:
    """True if a loop of ``numel`` elements computing ``exprs`` is worth prange."""
    count = hint(numel)
    return count >= PARALLEL_THRESHOLD or count * element_work(exprs) >= PARALLEL_WORK


HEADER = (
    f"# kernel helpers {HELPERS_DIGEST}\n"  # a helper change makes a new module (lib_version)
    "import math\n"
    "import numba\n"
    "import numpy as np\n"
    "from numba import prange\n"
    "from simaccel.codegen import kernel_lib as lib\n"
    # the integer functions of dynamic size expressions (only numba imports this module)
    f"from simaccel.codegen.size_lib import {', '.join(SIZE_FUNCTION_NAMES)}\n"
)


def index_source(offset: str) -> str:
    """An element index as an unsigned integer. Offsets are never negative, and numba skips
    its negative-index wraparound for unsigned indices: with a signed index LLVM cannot
    vectorise loops whose bounds it does not know (every prange chunk), ~7x slower."""
    return f"np.uint64({offset})"


def dtype_ctor(dtype: str) -> str:
    """The constructor of a ``dtype`` value in kernels (16-bit floats compute as float32)."""
    return "bool" if dtype == "bool" else f"np.{compute_dtype(dtype)}"


def store_source(value: str, dtype: str) -> str:
    """Source of ``value`` as stored into a ``dtype`` buffer: 16-bit floats round (to
    nearest even) into their raw bits here, once, at the store."""
    return f"{HALF_STORE[dtype]}({value})" if dtype in HALF_DTYPES else value


def const_source(value, dtype: str) -> str:
    dtype = compute_dtype(dtype)
    if dtype == "bool":
        return "True" if value else "False"
    if is_float(dtype):
        value = float(value)
        if math.isnan(value):
            return f"np.{dtype}(np.nan)"
        if math.isinf(value):
            return f"np.{dtype}({'-' if value < 0 else ''}np.inf)"
        return f"np.{dtype}({value!r})"
    return f"np.{dtype}({int(value)})"


def has_fast_trig(expr: Op) -> bool:
    """Whether ``expr`` is a sin/cos with a vectorisable float32 helper (16-bit floats
    compute as float32 in kernels, so theirs too: on libm a bfloat16 chain with a sin ran
    8x slower than the float32 one)."""
    return expr.name in scalar_ops.RANGE_CHECKED and len(expr.args) == 1 \
        and compute_dtype(expr.args[0].dtype) == "float32"


#: the kernel-local count of arguments outside a fast helper's exact range.
RANGE_FLAG = "wide_args"
#: the count of out-of-range gather/scatter indices a kernel met (see with_index_check)
INDEX_FLAG = "bad_indices"


class BodyEmitter:
    """Turns expression DAGs into straight-line statements with one temp per distinct
    value: structurally equal nodes (see :class:`StructuralKeys`) share a temp, so loads
    and subexpressions common to several fused bodies are emitted once.

    With ``fast_trig``, float32 sin/cos use the vectorisable helpers and count the
    arguments outside their exact range into ``RANGE_FLAG`` (``range_checked`` is then
    True, and the kernel must recompute itself exactly when the count is non-zero)."""

    def __init__(self, indent: str, fast_trig: bool = False,
                 keys: StructuralKeys | None = None, prefix: str = "t"):
        self.indent = indent
        #: temps are named ``<prefix><n>`` (the stages of a row kernel use their own)
        self.prefix = prefix
        self.fast_trig = fast_trig
        self.range_checked = False
        #: temps holding each fast helper's out-of-range count (see :meth:`flag_lines`)
        self.wide_terms: list[str] = []
        self.keys = keys or StructuralKeys()
        self.lines: list[str] = []
        self.names: dict[int, str] = {}

    def _new(self, src: str) -> str:
        name = f"{self.prefix}{len(self.lines)}"
        self.lines.append(f"{self.indent}{name} = {src}")
        return name

    def value(self, expr: Expr) -> str:
        key = self.keys(expr)
        if key not in self.names:
            self.names[key] = self._emit(expr)
        return self.names[key]

    def _emit(self, expr: Expr) -> str:
        if isinstance(expr, Const):
            return const_source(expr.value, expr.dtype)
        if isinstance(expr, Load):
            idx = [f"np.int64({self.value(e)})" for e in expr.index_exprs]
            offset = expr.offset.format(*idx) if idx else expr.offset
            element = f"{expr.buffer}[{index_source(offset)}]"
            if expr.dtype in HALF_DTYPES:  # raw 16-bit float bits -> float32
                element = f"{HALF_LOAD[expr.dtype]}({element})"
            return self._new(element)
        if isinstance(expr, IndexValue):
            return self._new(f"{dtype_ctor(expr.dtype)}({expr.index})")
        if isinstance(expr, Op) and expr.name == "checked_index":
            index, size = (self.value(a) for a in expr.args)
            self.lines.append(f"{self.indent}{INDEX_FLAG} += lib.index_outside({index}, {size})")
            return self._new(f"np.int64(lib.clamped_index({index}, {size}))")
        if isinstance(expr, Op):
            args = [self.value(a) for a in expr.args]
            dtypes = [a.dtype for a in expr.args]
            if self.fast_trig and has_fast_trig(expr):
                return self._range_checked(expr, args[0])
            src = scalar_ops.render(expr.name, args, dtypes, expr.dtype)
            return self._new(f"{dtype_ctor(expr.dtype)}({src})")
        raise TypeError(f"unknown expression node {type(expr).__name__}")

    def _range_checked(self, expr: Op, arg: str) -> str:
        name = self._new(f"{dtype_ctor(expr.dtype)}({scalar_ops.RANGE_CHECKED[expr.name]}({arg}))")
        self.wide_terms.append(self._new(f"lib.trig_arg_wide({arg})"))
        self.range_checked = True
        return name

    def flag_lines(self) -> list[str]:
        """The one statement counting this body's out-of-range arguments into
        :data:`RANGE_FLAG` (none without fast trig helpers): numba's prange accepts a
        reduction variable updated once per iteration, not once per helper."""
        if not self.wide_terms:
            return []
        return [f"{self.indent}{RANGE_FLAG} += {' + '.join(self.wide_terms)}"]


def _decorator(parallel: bool) -> str:
    return (f"@numba.njit(cache=True, nogil=True, error_model='numpy', "
            f"parallel={parallel})\n")


def with_exact_rerun(nest: Callable[[bool], tuple[list[str], bool]],
                     rerunnable: bool) -> list[str]:
    """The kernel body from ``nest(fast_trig) -> (lines, range_checked)``, the loop nest at
    one indent level. A fast nest whose range check can fire is followed by an exact
    rerun: the fast loop stays call-free (vectorised), and the rare kernel that meets a
    huge argument pays one more pass with libm. ``rerunnable``: running the nest twice
    gives the same result (no scatter-accumulate, no read of its own output)."""
    lines, checked = nest(rerunnable)
    if not checked:
        return lines
    exact, _ = nest(False)
    return ([f"    {RANGE_FLAG} = 0"] + lines + [f"    if {RANGE_FLAG}:"]
            + ["    " + line for line in exact])


def with_index_check(body: list[str]) -> list[str]:
    """``body`` (a kernel's statements at one indent level) raising
    :class:`~simaccel.errors.KernelIndexError` after its loops when it counted an
    out-of-range gather or scatter index into :data:`INDEX_FLAG` (each such index is
    clamped into its buffer meanwhile): a raise inside a prange loop would keep numba
    from parallelising it. Eager PyTorch raises for such an index too. A native kernel
    returns the exception as a status, which its launch raises as the same class."""
    if not any(INDEX_FLAG in line for line in body):
        return body
    return ([f"    {INDEX_FLAG} = 0"] + body + [
        f"    if {INDEX_FLAG}:",
        "        raise lib.KernelIndexError()"])


#: a static innermost loop shorter than this many iterations is merged with the loops
#: around it. LLVM vectorises a loop with 16 lanes (AVX-512 float32) interleaved 4 times
#: and runs a shorter trip count scalar: measured on a q/k/v bias-plus-transpose copy of
#: 16K float32 elements, inner loops of 16-32 took 13 us, the same loops merged into one
#: of 2048 (indices by ``//`` and ``%``) 5 us, and an inner loop of 64 1.5 us unmerged.
SHORT_LOOP = 64


def loop_nest(index: list[str], shape: tuple[int, ...], parallel: bool,
              indent: str) -> tuple[list[str], str]:
    """The ``for`` statements of a loop nest over ``index`` (extents ``shape``), the
    outermost a prange if ``parallel``, and the indent of its body. A short static tail
    (:data:`SHORT_LOOP`) becomes one loop whose body recovers the tail's indices."""
    start = _merged_tail_start(shape)
    lines = []
    for depth, (var, size) in enumerate(zip(index[:start], shape[:start])):
        rng = "prange" if parallel and depth == 0 else "range"
        lines.append(f"{indent}for {var} in {rng}({source(size)}):")
        indent += "    "
    if start == len(index):
        return lines, indent
    flat = f"{index[start]}_tail"
    rng = "prange" if parallel and start == 0 else "range"
    lines.append(f"{indent}for {flat} in {rng}({source(prod(shape[start:]))}):")
    indent += "    "
    return lines + split_flat(flat, index[start:], shape[start:], indent), indent


def _merged_tail_start(shape: tuple[Any, ...]) -> int:
    """The first dimension of the static tail of ``shape`` merged into one loop: the
    fewest trailing dimensions reaching :data:`SHORT_LOOP` iterations, when the innermost
    one is shorter (``len(shape)``: nothing merged)."""
    start, count = len(shape), 1
    while start > 0 and count < SHORT_LOOP and isinstance(shape[start - 1], int):
        count *= shape[start - 1]
        start -= 1
    return start if len(shape) - start > 1 else len(shape)


def kernel_args(out_buffer: str, body: list[Expr]) -> list[str]:
    reads = [b for b in buffers_read(body) if b != out_buffer]
    return [out_buffer] + reads


def kernel_module(args: list[str], parallel: bool,
                  nest: Callable[[bool], tuple[list[str], bool]], rerunnable: bool) -> str:
    """Module source of ``def kernel(*args)`` whose body is ``nest`` (see with_exact_rerun)."""
    body = hoist_out_of_loops(
        hoist_invariants(with_index_check(with_exact_rerun(nest, rerunnable)), args), args)
    return (HEADER + "\n\n" + _decorator(parallel) + f"def kernel({', '.join(args)}):\n"
            + "\n".join(body) + "\n")


_INIT = {
    "sum": lambda d: const_source(0, d), "prod": lambda d: const_source(1, d),
    "any": lambda d: "False", "all": lambda d: "True",
}


def reduce_init(op: str, acc_dtype: str) -> str:
    if op in _INIT:
        return _INIT[op](acc_dtype)
    low = op in ("max", "argmax")
    if is_float(acc_dtype):
        return const_source(-math.inf if low else math.inf, acc_dtype)
    if acc_dtype == "bool":
        return "False" if low else "True"
    bits = {"int8": 7, "int16": 15, "int32": 31, "int64": 63, "uint8": 8}[acc_dtype]
    if acc_dtype == "uint8":
        return const_source(0 if low else 255, acc_dtype)
    return const_source(-(1 << bits) if low else (1 << bits) - 1, acc_dtype)


def _short_extremum(k: ReductionKernel) -> bool:
    """True if ``k`` is a max or min reduction over one static loop of at most
    :data:`SHORT_LOOP` steps: its extent is hidden from LLVM (``lib.opaque_extent``), which
    would otherwise unroll the loop fully and leave one scalar compare per element (4x
    slower on 64-element rows: the attention softmax's row maximum)."""
    shape = k.red_shape
    return (len(shape) == 1 and isinstance(shape[0], int) and 1 < shape[0] <= SHORT_LOOP
            and all(part.reduce_op in ("max", "min") for part in k.parts))


def combine_source(op: str, v: str, ctor: str, acc: str) -> list[str]:
    """Statements folding the value ``v`` (converted by ``ctor``) into the accumulator
    ``acc`` (a name, or an element of an accumulator array) for reduction ``op``."""
    if op == "sum":
        return [f"{acc} = lib.reassoc_add({acc}, {ctor}({v}))"]
    if op == "prod":
        return [f"{acc} = {ctor}({acc} * {v})"]
    if op == "max":
        return [f"{acc} = lib.max_combine({acc}, {ctor}({v}))"]
    if op == "min":
        return [f"{acc} = lib.min_combine({acc}, {ctor}({v}))"]
    if op == "any":
        return [f"{acc} = {acc} or ({v} != 0)"]
    if op == "all":
        return [f"{acc} = {acc} and ({v} != 0)"]
    cmp = ">" if op == "argmax" else "<"
    return [f"if {v} {cmp} {acc} or ({v} != {v} and {acc} == {acc}):",
            f"    {acc} = {v}", "    arg = ridx", ]


def _flat_output_loop(index: list[str], shape: tuple[int, ...],
                      parallel: bool) -> tuple[list[str], str]:
    """One loop over all output elements of a reduction, its indices recovered by ``//``
    and ``%`` once per output: LLVM vectorises the inner reduction loop of a shallow nest
    far more reliably than of a deep one, and prange balances better over a flat range."""
    if len(index) <= 1:
        return loop_nest(index, shape, parallel, "    ")
    rng = "prange" if parallel else "range"
    return [f"    for o in {rng}({source(prod(shape))}):"] + \
        split_flat("o", index, shape, "        "), "        "


def split_flat(flat: str, index: list[str], shape: tuple, indent: str) -> list[str]:
    """Statements setting the loop variables ``index`` (extents ``shape``) from their
    row-major position ``flat``."""
    lines = []
    for k, (var, size, stride) in enumerate(zip(index, shape, contiguous_strides(shape))):
        q = f"{flat} // {source(stride)}" if not is_value(stride, 1) else flat
        lines.append(f"{indent}{var} = {q}" if k == 0
                     else f"{indent}{var} = ({q}) % {source(size)}")
    return lines


def emit_reduction(k: ReductionKernel) -> tuple[str, list[str]]:
    """Module source and argument buffer names of a reduction kernel and its fused
    siblings: one loop nest, one accumulator per distinct (op, body), one store each."""
    parts = k.parts
    outs = [p.out.buffer for p in parts]
    reads = buffers_read([p.body for p in parts])
    args = outs + [b for b in reads if b not in outs]
    parallel = parallel_loop(k.numel, [p.body for p in parts]) and len(k.out_index) > 0 \
        and hint(k.out.numel) > 1
    rerunnable = not set(outs) & set(reads)
    return kernel_module(args, parallel, lambda fast: _reduction_nest(k, parallel, fast),
                         rerunnable), args


def accumulator_slot(part: ReductionKernel, keys: StructuralKeys) -> tuple:
    """What makes two fused reductions share an accumulator: (op, acc dtype, body)."""
    return (part.reduce_op, part.acc_dtype, keys(part.body))


def accumulators(parts: list[ReductionKernel], keys: StructuralKeys, prefix: str = "acc"
                 ) -> dict[tuple, tuple[ReductionKernel, str]]:
    """The first part and accumulator name of each distinct :func:`accumulator_slot` of
    ``parts``, in order (siblings reducing the same value the same way share one)."""
    found: dict[tuple, tuple[ReductionKernel, str]] = {}
    for part in parts:
        found.setdefault(accumulator_slot(part, keys), (part, f"{prefix}{len(found)}"))
    return found


def _reduction_nest(k: ReductionKernel, parallel: bool,
                    fast_trig: bool) -> tuple[list[str], bool]:
    lines, indent = _flat_output_loop(k.out_index, k.out_loop_shape, parallel)
    body, checked = reduction_body(k, indent, fast_trig)
    return lines + body, checked


def reduction_body(k: ReductionKernel, indent: str, fast_trig: bool,
                   prefix: str = "", side_stores: Sequence[Any] = ()
                   ) -> tuple[list[str], bool]:
    """The statements of a reduction (and its siblings) for one output element, its
    output indices set (at ``indent``): accumulators, the reduced loops, the stores; and
    whether a fast helper's range check can fire. ``prefix`` names its temps and
    accumulators apart from other stages of a row kernel; ``side_stores``
    (:class:`~simaccel.codegen.row_reuse.SideStore`) are values of the body the reduced
    loop also stores, for a later stage of its row kernel."""
    lines: list[str] = []
    red_lines, inner = loop_nest(k.red_index, k.red_shape, False, indent)
    if _short_extremum(k):
        red_lines = [red_lines[0].replace(f"range({k.red_shape[0]})",
                                          f"range(lib.opaque_extent(np.int64("
                                          f"{k.red_shape[0]})))")]  # one signature
    body = BodyEmitter(inner, fast_trig, prefix=f"{prefix}t")
    acc_of = accumulators(k.parts, body.keys, f"{prefix}acc")
    combine: list[str] = []
    for part, acc in acc_of.values():
        lines.append(f"{indent}{acc} = {reduce_init(part.reduce_op, part.acc_dtype)}")
        v = body.value(part.body)
        combine += [inner + line for line in
                    combine_source(part.reduce_op, v, dtype_ctor(part.acc_dtype), acc)]
    for side in side_stores:
        v = body.value(side.value)
        combine.append(f"{inner}{side.buffer}[{index_source(side.offset)}] = "
                       f"{store_source(v, side.value.dtype)}")
    is_arg = k.reduce_op in ("argmax", "argmin")  # never fused (see fusion.py)
    if is_arg:
        lines += [f"{indent}arg = 0", f"{indent}ridx = 0"]
        combine.append(f"{inner}ridx += 1")
    stores = []
    for part in k.parts:
        acc = acc_of[accumulator_slot(part, body.keys)][1]
        result = "arg" if is_arg else (part.finalize.format(acc=acc) if part.finalize else acc)
        out_dtype = "int64" if is_arg else part.out_dtype
        value = store_source(f"{dtype_ctor(out_dtype)}({result})", out_dtype)
        stores.append(f"{indent}{part.out.buffer}[{index_source(part.out_offset_src)}] = {value}")
    return (lines + red_lines + body.lines + body.flag_lines() + combine + stores,
            body.range_checked)


def emit_extern(k: ExternKernel) -> tuple[str, list[str]]:
    """Module source and argument buffer names of a template kernel."""
    body = k.source.replace("def kernel(", _decorator(k.parallel) + "def kernel(", 1)
    return HEADER + "\n\n" + body, list(k.buffers)

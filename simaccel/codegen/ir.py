"""The kernel IR: scalar expressions over device buffers, and the kernels built from them.

A kernel computes, for every index of an iteration space, a scalar expression
(:class:`Expr`) that reads operands with :class:`Load`. Index arithmetic is kept as
Python-source strings over loop variables and size symbols (``"i0*64 + i1"``,
``"i0*s1 + i1"``: a dynamic size is a kernel argument, see :mod:`simaccel.codegen.sizes`);
:func:`affine` and friends fold constants so the emitted source stays readable.

Kernels:

* :class:`PointwiseKernel`: ``out[layout(i)] = body(i)`` for every ``i`` in ``shape``.
* :class:`ReductionKernel`: ``out[layout(o)] = reduce_r body(o, r)``.
* :class:`RowKernel`: reductions and pointwise kernels over the same rows, run row by row
  (a softmax, a layer norm: each row's passes read it from cache, not from memory).
* :class:`ExternKernel`: a hand-written template (matmul, convolution, pooling, scan...).
* :class:`LibraryKernel`: a call into a tuned library on device buffers (GEMM).

Every kernel declares exactly which buffers it ``reads`` and ``writes`` (frozensets of
buffer names); fusion, liveness, memory planning, host mapping and the runtime all use
those two sets and nothing re-derives them. A kernel's ``on_device`` is True (a host
fallback op, :class:`simaccel.codegen.hostop.HostOp`, has the same three members).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from simaccel.codegen.dtypes import is_float
from simaccel.codegen.sizes import Size, is_symbolic, is_value, prod, source


# --------------------------------------------------------------------------- index strings


def affine(terms: list[tuple[str, Size]], const: Size = 0) -> str:
    """Source for ``const + sum(var * coeff)``, dropping zero terms and unit coefficients
    (a symbolic coefficient is a size expression, never known to be 0 or 1)."""
    parts = [] if is_value(const, 0) else [source(const)]
    for var, coeff in terms:
        if is_value(coeff, 0) or var == "0":
            continue
        parts.append(var if is_value(coeff, 1) else f"{paren(var)}*{source(coeff)}")
    return " + ".join(parts) if parts else "0"


def paren(src: str) -> str:
    return src if src.replace("_", "").isalnum() else f"({src})"


# --------------------------------------------------------------------------- expressions


class Expr:
    """A scalar expression node. ``dtype`` is the numpy dtype name of its value."""

    dtype: str

    def children(self) -> tuple["Expr", ...]:
        return ()


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: Any
    dtype: str


@dataclass(frozen=True, eq=False)
class Load(Expr):
    """Read ``buffer[offset]``; ``offset`` is an index string, which may name the values
    of ``index_exprs`` as ``{0}``, ``{1}``... (indirect loads: gather, embedding)."""

    buffer: str
    offset: str
    dtype: str
    index_exprs: tuple[Expr, ...] = ()

    def children(self) -> tuple[Expr, ...]:
        return self.index_exprs


@dataclass(frozen=True, eq=False)
class IndexValue(Expr):
    """The value of an index string (arange, iota, tril masks)."""

    index: str
    dtype: str


@dataclass(frozen=True, eq=False)
class Op(Expr):
    """Apply the scalar operation ``name`` (see :mod:`simaccel.codegen.scalar_ops`)."""

    name: str
    args: tuple[Expr, ...]
    dtype: str

    def children(self) -> tuple[Expr, ...]:
        return self.args


def size_value(value: Size, dtype: str = "int64") -> Expr:
    """A size as a scalar expression: a constant, or (dynamic) the kernel's size argument."""
    if is_symbolic(value):
        return IndexValue(source(value), dtype)
    return Const(int(value), dtype)


def count_ops(expr: Expr, limit: int = 1000) -> int:
    """Number of distinct nodes in ``expr``'s DAG (stops counting at ``limit``)."""
    seen: set[int] = set()
    stack = [expr]
    while stack and len(seen) < limit:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(node.children())
    return len(seen)


def expr_nodes(exprs: list[Expr]) -> list[Expr]:
    """Every node of the expressions once, parents before children, in first-seen order."""
    seen: set[int] = set()
    order: list[Expr] = []
    stack = list(exprs)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        stack.extend(node.children())
    return order


def loads(exprs: list[Expr]) -> list[Load]:
    """Every load in the expressions (each node once), in first-seen order."""
    return [node for node in expr_nodes(exprs) if isinstance(node, Load)]


def buffers_read(exprs: list[Expr]) -> list[str]:
    """Names of the buffers the expressions load from, in first-seen order."""
    return list(dict.fromkeys(load.buffer for load in loads(exprs)))


class StructuralKeys:
    """Integer keys of expressions by structure: two nodes get the same key iff they are
    the same operation on the same operands (same loads, constants, dtypes), i.e. compute
    the same value, whichever lowering built them. Linear in the DAG's size."""

    def __init__(self) -> None:
        self._keys: dict[tuple, int] = {}
        self._by_node: dict[int, tuple[int, Expr]] = {}  # keeps the node alive: ids stay unique

    def __call__(self, expr: Expr) -> int:
        known = self._by_node.get(id(expr))
        if known is not None:
            return known[0]
        children = tuple(self(c) for c in expr.children())
        shape = (type(expr).__name__, expr.dtype, _own_fields(expr), children)
        key = self._keys.setdefault(shape, len(self._keys))
        self._by_node[id(expr)] = (key, expr)
        return key


def _own_fields(expr: Expr) -> tuple:
    if isinstance(expr, Const):
        # hex() tells 0.0 from -0.0 and equates 1 with 1.0 (the same emitted constant)
        return (float(expr.value).hex() if is_float(expr.dtype) else repr(expr.value),)
    if isinstance(expr, Load):
        return (expr.buffer, expr.offset)
    if isinstance(expr, IndexValue):
        return (expr.index,)
    if isinstance(expr, Op):
        return (expr.name,)
    raise TypeError(f"unknown expression node {type(expr).__name__}")


# --------------------------------------------------------------------------- kernels


@dataclass
class Layout:
    """Where a tensor lives in a buffer: element strides and offset (elements)."""

    buffer: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    def offset_source(self, index: list[str]) -> str:
        return affine(list(zip(index, self.strides)), self.offset)

    @property
    def numel(self) -> int:
        return prod(self.shape)


def dense_strides(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """True if (shape, stride) covers exactly prod(shape) elements without overlap (a
    permutation of a contiguous layout)."""
    dims = sorted((s, n) for s, n in zip(stride, shape) if n != 1)
    expected = 1
    for s, n in dims:
        if s != expected:
            return False
        expected *= n
    return True


def contiguous_strides(shape: tuple[Size, ...]) -> tuple[Size, ...]:
    """Row-major strides (elements); a size-0 dim counts as 1, as in ATen."""
    strides: list[Size] = []
    acc: Size = 1
    for size in reversed(shape):
        strides.append(acc)
        acc = acc * (size if is_symbolic(size) else max(size, 1))
    return tuple(reversed(strides))


@dataclass
class PointwiseKernel:
    """``out[out.offset_source(i)] = body`` for every index ``i`` of ``out.shape``."""

    name: str
    out: Layout
    body: Expr
    index: list[str] = field(default_factory=list)
    #: scatter kernels: the store offset is ``store_offset`` formatted with the values of
    #: ``store_index_exprs`` (and ``+=`` when ``accumulate``); such kernels run serially.
    store_offset: str = ""
    store_index_exprs: tuple[Expr, ...] = ()
    accumulate: bool = False
    iter_shape: tuple[int, ...] | None = None  # scatter kernels loop over their source
    #: pointwise kernels fused horizontally after this one (:mod:`simaccel.codegen.fusion`):
    #: one launch runs every part's loop nest in program order
    siblings: list["PointwiseKernel"] = field(default_factory=list)
    #: parts of a fused launch computed in this part's loop nest, after its store, in
    #: order (:func:`simaccel.codegen.fusion.share_loop_nests`): the same indices and
    #: extents, each reading what an earlier store of the nest wrote only at the element
    #: that iteration stored
    mates: list["PointwiseKernel"] = field(default_factory=list)

    on_device: ClassVar[bool] = True

    @property
    def parts(self) -> list["PointwiseKernel"]:
        """This kernel and its fused siblings, in program order."""
        return [self, *self.siblings]

    @property
    def stores(self) -> list["PointwiseKernel"]:
        """Every store of this part's loop nest: its own, then its mates'."""
        return [self, *self.mates]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.out.shape if self.iter_shape is None else self.iter_shape

    @property
    def reads(self) -> frozenset[str]:
        """Buffers the bodies and store indices load (and the output when accumulating);
        a sibling's read of an earlier part's output counts too (it reads device memory)."""
        reads: set[str] = set()
        for part in self.parts:
            for store in part.stores:
                reads.update(buffers_read([store.body, *store.store_index_exprs]))
                if store.accumulate:
                    reads.add(store.out.buffer)
        return frozenset(reads)

    @property
    def writes(self) -> frozenset[str]:
        return frozenset(store.out.buffer for part in self.parts for store in part.stores)

    @property
    def numel(self) -> int:
        """Elements of this part's iteration space (siblings have their own)."""
        return prod(self.shape)


@dataclass
class ReductionKernel:
    """For each output index ``o`` (the non-reduced dims), fold ``body(o, r)`` over ``r``.

    ``reduce_op`` is one of sum, prod, max, min, argmax, argmin, any, all.
    ``acc_dtype`` is the accumulator dtype (float64 for float32 sums, for accuracy).
    """

    name: str
    out: Layout
    out_dtype: str
    out_index: list[str]
    out_loop_shape: tuple[int, ...]
    out_offset_src: str
    red_index: list[str]
    red_shape: tuple[int, ...]
    body: Expr
    reduce_op: str
    acc_dtype: str
    finalize: str = ""  # optional source applied to ``acc`` (e.g. mean's division)
    #: horizontal fusion: more reductions over the same loop nest (same ``out_index``,
    #: ``out_loop_shape``, ``red_index``, ``red_shape``), computed in the same pass over
    #: the input, each into its own output (see :mod:`simaccel.codegen.fusion`).
    siblings: list["ReductionKernel"] = field(default_factory=list)

    @property
    def numel(self) -> int:
        return self.out.numel * prod(self.red_shape)

    on_device: ClassVar[bool] = True

    @property
    def parts(self) -> list["ReductionKernel"]:
        """This reduction and its fused siblings, in program order."""
        return [self, *self.siblings]

    @property
    def reads(self) -> frozenset[str]:
        return frozenset(buffers_read([p.body for p in self.parts]))

    @property
    def writes(self) -> frozenset[str]:
        return frozenset(p.out.buffer for p in self.parts)


class _DeclaredWrites:
    """A kernel over a list of ``buffers`` that declares the ones it ``writes`` (a
    non-empty subset, checked); it reads the others."""

    name: str
    buffers: list[str]
    writes: frozenset[str]
    on_device: ClassVar[bool] = True

    def __post_init__(self) -> None:
        declared = frozenset(self.writes)
        if not declared or not declared <= set(self.buffers):
            raise ValueError(f"kernel {self.name} must declare the buffers it writes, a "
                             f"non-empty subset of its buffers {self.buffers}; got "
                             f"{sorted(declared)}")
        self.writes = declared

    @property
    def reads(self) -> frozenset[str]:
        return frozenset(self.buffers) - self.writes


@dataclass
class ExternKernel(_DeclaredWrites):
    """A template kernel (see :mod:`simaccel.codegen.templates`): ``source`` defines
    ``kernel(*buffers, *params)``; buffers are flat arrays, params integers (shapes).
    ``writes``: the buffers the template stores to (outputs and scratch); it reads the
    others."""

    name: str
    source: str
    buffers: list[str]
    params: list[Any]
    flops: int
    bytes_moved: int
    writes: frozenset[str]
    parallel: bool = False
    #: the template's tier-0 form (numpy, same arguments), run while numba compiles it;
    #: None: the first call waits for the compile
    numpy_source: str | None = None


@dataclass
class LibraryKernel(_DeclaredWrites):
    """``fn(*buffers, *params)`` on flat device buffers, a call into a tuned library (see
    :mod:`simaccel.codegen.library`); ``params`` are integers; ``flops`` and
    ``bytes_moved`` feed the roofline model; ``writes`` as for :class:`ExternKernel`."""

    name: str
    fn: Callable[..., Any]
    buffers: list[str]
    params: list[int]
    flops: int
    bytes_moved: int
    writes: frozenset[str]


@dataclass
class RowKernel:
    """For each of ``rows`` rows, every stage over that row's ``inner`` elements, in order
    (:mod:`simaccel.codegen.fusion_rows`): a :class:`ReductionKernel` stage (with its
    siblings) folds the row into one value per part; a :class:`PointwiseKernel` stage,
    whose iteration space is ``rows`` x ``inner``, computes the row's elements. A stage
    reads what an earlier stage wrote only in its own row (checked when fusing), so rows
    are independent and a row's later passes find its data in cache."""

    name: str
    rows: Size
    inner: tuple[Size, ...]
    stages: list[ReductionKernel | PointwiseKernel]

    on_device: ClassVar[bool] = True

    @property
    def reads(self) -> frozenset[str]:
        return frozenset().union(*(stage.reads for stage in self.stages))

    @property
    def writes(self) -> frozenset[str]:
        return frozenset().union(*(stage.writes for stage in self.stages))

    @property
    def numel(self) -> Size:
        """Elements of all stages' iteration spaces (each stage passes over the rows)."""
        return sum((stage.numel for stage in self.stages), start=0)


Kernel = PointwiseKernel | ReductionKernel | RowKernel | ExternKernel | LibraryKernel

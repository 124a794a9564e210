"""Tensor values during lowering: in device memory (:class:`Realized`) or not yet
computed (:class:`Lazy`, a pointwise function of the index that fuses into its users).

Views never launch a kernel: on a realized tensor they change strides and offset,
on a lazy one they remap the index.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from simaccel.codegen.ir import Expr, Layout, Load, Op, affine, contiguous_strides, paren
from simaccel.codegen.sizes import (Size, is_value, prod, same_size, size, smax, smin,
                                    source)

IndexFn = Callable[[list[str]], Expr]


@dataclass
class TensorValue:
    shape: tuple[int, ...]
    dtype: str

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return prod(self.shape)

    def load(self, index: list[str]) -> Expr:
        raise NotImplementedError


@dataclass
class Realized(TensorValue):
    layout: Layout

    def load(self, index: list[str]) -> Expr:
        return Load(self.layout.buffer, self.layout.offset_source(index), self.dtype)

    def restrided(self, shape, strides, offset) -> "Realized":
        layout = Layout(self.layout.buffer, tuple(shape), tuple(strides), offset)
        return Realized(tuple(shape), self.dtype, layout)

    def is_contiguous(self) -> bool:
        expected = contiguous_strides(self.shape)
        return all(is_value(n, 1) or same_size(s, e)
                   for n, s, e in zip(self.shape, self.layout.strides, expected))


@dataclass
class Lazy(TensorValue):
    fn: IndexFn
    ops: int = 1  # how many scalar ops computing one element costs (inlining heuristic)
    memo: dict = field(default_factory=dict, repr=False, compare=False)
    #: ``(base, dims)`` when this is ``permute(base, dims)`` of a lazy ``base``: a
    #: consumer reading a stored tensor at any strides (a GEMM operand) realizes ``base``
    #: once and reads it permuted, instead of computing this view in its own layout
    permuted: tuple | None = field(default=None, repr=False, compare=False)

    def load(self, index: list[str]) -> Expr:
        # Memoised so that a value used twice in one kernel is one DAG node (emitted once).
        key = tuple(index)
        if key not in self.memo:
            self.memo[key] = self.fn(list(index))
        return self.memo[key]


def cast(expr: Expr, dtype: str) -> Expr:
    return expr if expr.dtype == dtype else Op("cast", (expr,), dtype)


def broadcast_index(shape: tuple[int, ...], out_shape: tuple[int, ...],
                    index: list[str]) -> list[str]:
    """The index into a tensor of ``shape`` broadcast to ``out_shape``."""
    lead = len(out_shape) - len(shape)
    return ["0" if is_value(n, 1) and not is_value(out_shape[lead + k], 1) else index[lead + k]
            for k, n in enumerate(shape)]


def load_broadcast(value: TensorValue, out_shape: tuple[int, ...], index: list[str]) -> Expr:
    return value.load(broadcast_index(value.shape, out_shape, index))


# --------------------------------------------------------------------------- views


def permute(value: TensorValue, dims: list[int]) -> TensorValue:
    dims = [d % value.ndim for d in dims] if value.ndim else []
    shape = tuple(value.shape[d] for d in dims)
    if isinstance(value, Realized):
        strides = [value.layout.strides[d] for d in dims]
        return value.restrided(shape, strides, value.layout.offset)

    def fn(index: list[str]) -> Expr:
        old = [""] * len(dims)
        for new_pos, old_pos in enumerate(dims):
            old[old_pos] = index[new_pos]
        return value.load(old)
    return Lazy(shape, value.dtype, fn, getattr(value, "ops", 1), permuted=(value, dims))


def expand(value: TensorValue, shape: list[int]) -> TensorValue:
    lead = len(shape) - value.ndim
    shape = tuple(value.shape[k - lead] if is_value(s, -1) else s for k, s in enumerate(shape))
    if isinstance(value, Realized):
        strides = [0] * lead + [0 if is_value(value.shape[k], 1)
                                and not is_value(shape[lead + k], 1) else st
                                for k, st in enumerate(value.layout.strides)]
        return value.restrided(shape, strides, value.layout.offset)
    return Lazy(shape, value.dtype,
                lambda index: load_broadcast(value, shape, index), getattr(value, "ops", 1))


def unsqueeze(value: TensorValue, dim: int) -> TensorValue:
    dim = dim % (value.ndim + 1)
    shape = value.shape[:dim] + (1,) + value.shape[dim:]
    if isinstance(value, Realized):
        strides = list(value.layout.strides)
        strides.insert(dim, 0)
        return value.restrided(shape, strides, value.layout.offset)
    return Lazy(shape, value.dtype, lambda index: value.load(index[:dim] + index[dim + 1:]),
                getattr(value, "ops", 1))


def squeeze(value: TensorValue, dims: list[int] | None) -> TensorValue:
    if dims is None:
        dims = list(range(value.ndim))
    dims = [d % value.ndim for d in dims] if value.ndim else []
    drop = {d for d in dims if is_value(value.shape[d], 1)}
    keep = [k for k in range(value.ndim) if k not in drop]
    shape = tuple(value.shape[k] for k in keep)
    if isinstance(value, Realized):
        strides = [value.layout.strides[k] for k in keep]
        return value.restrided(shape, strides, value.layout.offset)

    def fn(index: list[str]) -> Expr:
        full, it = [], iter(index)
        for k in range(value.ndim):
            full.append("0" if k in drop else next(it))
        return value.load(full)
    return Lazy(shape, value.dtype, fn, getattr(value, "ops", 1))


def slice_dim(value: TensorValue, dim: int, start: int, end: int, step: int) -> TensorValue:
    dim = dim % value.ndim
    start, end = _clamp_slice(start, end, value.shape[dim])
    length = smax(0, (end - start + step - 1) // step)
    shape = value.shape[:dim] + (length,) + value.shape[dim + 1:]
    if isinstance(value, Realized):
        strides = list(value.layout.strides)
        offset = value.layout.offset + start * strides[dim]
        strides[dim] *= step
        return value.restrided(shape, strides, offset)

    def fn(index: list[str]) -> Expr:
        idx = list(index)
        idx[dim] = affine([(idx[dim], step)], start)
        return value.load(idx)
    return Lazy(shape, value.dtype, fn, getattr(value, "ops", 1))


#: an ``end`` this large means "to the end" (ATen passes INT64_MAX for ``x[a:]``)
_OPEN_END = 1 << 62


def _clamp_slice(start: Size | None, end: Size | None, n: Size) -> tuple[Size, Size]:
    """ATen's slice bounds for a dim of ``n`` elements (negative counts from the end,
    clamped into ``[0, n]``); symbolic bounds stay symbolic."""
    start = 0 if start is None else start
    end = n if end is None or (isinstance(end, int) and end >= _OPEN_END) else end
    start = start + n if _negative(start) else start
    end = end + n if _negative(end) else end
    start = smin(smax(start, 0), n)
    end = smin(smax(end, start), n)
    return start, end


def _negative(value: Size) -> bool:
    """``value < 0`` (a guard only if the shape env cannot tell, as Python slicing would)."""
    return bool(value < 0)


def select(value: TensorValue, dim: int, index_value: int) -> TensorValue:
    dim = dim % value.ndim
    index_value = index_value + value.shape[dim] if _negative(index_value) else index_value
    shape = value.shape[:dim] + value.shape[dim + 1:]
    if isinstance(value, Realized):
        strides = list(value.layout.strides)
        offset = value.layout.offset + index_value * strides.pop(dim)
        return value.restrided(shape, strides, offset)
    return Lazy(shape, value.dtype,
                lambda index: value.load(index[:dim] + [source(index_value)] + index[dim:]),
                getattr(value, "ops", 1))


def view_strides(shape: tuple[int, ...], strides: tuple[int, ...],
                 new_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Strides viewing a (shape, strides) tensor as ``new_shape`` without a copy, or None
    (the algorithm of ATen's ``computeStride``)."""
    numel = prod(shape)
    if not shape or is_value(numel, 0):
        return contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = strides[-1]
    tensor_numel, view_numel = 1, 1
    for tensor_d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[tensor_d]
        if tensor_d == 0 or (not is_value(shape[tensor_d - 1], 1) and
                             strides[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or is_value(new_shape[view_d], 1)):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = strides[tensor_d - 1]
                tensor_numel, view_numel = 1, 1
    return tuple(new_strides) if view_d == -1 else None


def reshape_groups(old: tuple[int, ...], new: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """Pair up runs of old and new dims with equal products (the dims a reshape merges
    or splits), ignoring size-1 dims. None when the shapes do not line up."""
    groups: list[tuple[list[int], list[int]]] = []
    o_dims = [d for d, s in enumerate(old) if not is_value(s, 1)]
    n_dims = [d for d, s in enumerate(new) if not is_value(s, 1)]
    i = j = 0
    while i < len(o_dims) or j < len(n_dims):
        if i >= len(o_dims) or j >= len(n_dims):
            return None
        go, gn = [o_dims[i]], [n_dims[j]]
        po, pn = old[o_dims[i]], new[n_dims[j]]
        i, j = i + 1, j + 1
        while po != pn:
            if po < pn and i < len(o_dims):
                go.append(o_dims[i])
                po *= old[o_dims[i]]
                i += 1
            elif pn < po and j < len(n_dims):
                gn.append(n_dims[j])
                pn *= new[n_dims[j]]
                j += 1
            else:
                return None
        groups.append((go, gn))
    return groups


def reshape_lazy(value: TensorValue, new_shape: tuple[int, ...]) -> Lazy:
    """Reshape by index arithmetic, group by group: a split dim becomes an affine
    combination of the new indices, a merged dim one ``//`` and ``%`` per old dim."""
    old_shape = value.shape
    groups = reshape_groups(old_shape, new_shape)
    if groups is None or any(is_value(n, 0) for n in old_shape):
        groups = [([d for d in range(len(old_shape))], [d for d in range(len(new_shape))])]

    def fn(index: list[str]) -> Expr:
        old = ["0"] * len(old_shape)
        for old_dims, new_dims in groups:
            sizes = [new_shape[d] for d in new_dims]
            flat = affine(list(zip([index[d] for d in new_dims], contiguous_strides(tuple(sizes)))))
            if len(old_dims) == 1:
                old[old_dims[0]] = flat
                continue
            strides = contiguous_strides(tuple(old_shape[d] for d in old_dims))
            for k, (d, stride) in enumerate(zip(old_dims, strides)):
                q = f"{paren(flat)} // {source(stride)}" if not is_value(stride, 1) else flat
                old[d] = q if k == 0 else f"({q}) % {source(old_shape[d])}"
        return value.load(old)
    return Lazy(tuple(new_shape), value.dtype, fn, getattr(value, "ops", 1))


def infer_shape(shape: list[Size], numel: Size) -> tuple[Size, ...]:
    """``shape`` with its ``-1`` (if any) inferred from ``numel``."""
    if any(is_value(s, -1) for s in shape):
        known = prod(s for s in shape if not is_value(s, -1))
        shape = [(numel // known if not is_value(known, 0) else 0) if is_value(s, -1) else s
                 for s in shape]
    return tuple(size(s) for s in shape)

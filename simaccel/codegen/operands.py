"""How lowerings hand tensors to templates and library calls.

Templates index flat buffers from element 0 in row-major order and read raw elements, so
an operand is made dense (:func:`dense`) and, if it is a 16-bit float, upcast to float32
first (:func:`as_compute`: a lazy cast, fused into the kernel that realizes it). The
template then runs in float32 and its result is cast back lazily (:func:`as_dtype`), so
the consumer's kernel rounds it once, when it stores. Pointwise and reduction kernels need
none of this: they load 16-bit buffers as float32 themselves (:mod:`.half_lib`).
"""
from __future__ import annotations

from typing import Any

from simaccel.codegen.dtypes import HALF_DTYPES, compute_dtype
from simaccel.codegen.sizes import is_value
from simaccel.codegen.values import Lazy, Realized, TensorValue, cast


def as_dtype(value: TensorValue, dtype: str) -> TensorValue:
    """``value`` converted to ``dtype`` lazily (as it is when it has that dtype)."""
    if value.dtype == dtype:
        return value
    return Lazy(value.shape, dtype, lambda index: cast(value.load(index), dtype),
                getattr(value, "ops", 0) + 1)


def as_compute(value: TensorValue) -> TensorValue:
    """``value`` in its compute dtype: a 16-bit float as float32."""
    return as_dtype(value, compute_dtype(value.dtype))


def is_half(dtype: str) -> bool:
    return dtype in HALF_DTYPES


def dense(ctx: Any, value: TensorValue, dtype: str | None = None) -> Realized:
    """``value`` (as ``dtype``, by default its compute dtype) in a row-major buffer from
    element 0: itself when it is one already, else a copy."""
    value = as_dtype(value, dtype or compute_dtype(value.dtype))
    if isinstance(value, Realized) and value.is_contiguous() \
            and is_value(value.layout.offset, 0):
        return value
    return ctx.realize_contiguous_copy(value)


def rows(shape: tuple, dim: int) -> tuple[Any, Any, Any]:
    """(outer, n, inner): a row-major tensor of ``shape`` seen as rows of ``n`` elements
    along ``dim``, element ``k`` of row (o, i) at ``(o*n + k)*inner + i``."""
    if not shape:
        return 1, 1, 1
    dim = dim % len(shape)
    outer, inner = 1, 1
    for s in shape[:dim]:
        outer = outer * s
    for s in shape[dim + 1:]:
        inner = inner * s
    return outer, shape[dim], inner

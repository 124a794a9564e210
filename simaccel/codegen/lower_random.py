"""Random bits on the device: ``simaccel::random_bits`` (:mod:`simaccel.dropout_rng`),
the hash of the call's seed, a stream and each element's row-major index, computed by
the kernel that reads it (:func:`simaccel.codegen.hash_lib.random_bits`): an active
dropout's mask costs no buffer, only ~20 integer operations per element."""
from __future__ import annotations

from typing import Any

import torch

import simaccel.dropout_rng  # noqa: F401 - defines the op
from simaccel.codegen.graph import GraphLowering, Unsupported
from simaccel.codegen.ir import Const, Expr, IndexValue, Op, affine, contiguous_strides
from simaccel.codegen.lowering import operand_expr
from simaccel.codegen.registry import register
from simaccel.codegen.values import Lazy, TensorValue

#: scalar ops per element (the hash's two rounds and the index's mix)
_HASH_OPS = 20


@register(torch.ops.simaccel.random_bits.default)
def _random_bits(ctx: GraphLowering, seed: Any, shape: Any, stream: int) -> Lazy:
    """The bits as a lazy value: one ``random_bits`` op on the element's flat index."""
    if not isinstance(seed, TensorValue) or seed.ndim != 0:
        raise Unsupported("random bits need a 0-d seed tensor")
    out_shape = ctx.out_shape()
    strides = contiguous_strides(out_shape)

    def fn(index: list[str]) -> Expr:
        flat = IndexValue(affine(list(zip(index, strides))), "int64")
        return Op("random_bits", (flat, operand_expr(seed, (), [], "int64"),
                                  Const(int(stream), "int64")), "int64")
    return Lazy(out_shape, "int64", fn, _HASH_OPS)

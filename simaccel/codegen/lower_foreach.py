"""``aten._foreach_*``: torch.optim's multi-tensor ops, one device value per list element.

A foreach op applies one pointwise op to each element of its tensor lists (Adam's
``_foreach_mul(exp_avgs, beta1)``, SGD's ``_foreach_add(params, grads, alpha=-lr)``). Each
element is lowered by the single-tensor lowering of that op, with the element's own
output shape and dtype, so consecutive foreach ops fuse per element into one kernel, as
the single-tensor (``foreach=False``) path does. Scalar arguments may be lifted scalars
(0-d values read from the constant bank, :mod:`simaccel.codegen.lower_scalar_args`).
"""
from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from simaccel.codegen.graph import INLINE_MAX_OPS, GraphLowering, Unsupported
from simaccel.codegen.ir import count_ops
from simaccel.codegen.lowering import elementwise
from simaccel.codegen.registry import LOWERINGS, register
from simaccel.codegen.values import Lazy, TensorValue, select

aten = torch.ops.aten


@dataclass
class _Element:
    """Stands for the foreach node while one element is lowered: the element's output
    metadata, the single-tensor op it is lowered as (kernel names, type promotion)."""

    target: Any
    val: Any
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    #: no fx inputs: dtype checks see the element's own value only
    all_input_nodes: tuple = ()
    users: dict = field(default_factory=dict)

    @property
    def meta(self) -> dict[str, Any]:
        return {"val": self.val}


@contextlib.contextmanager
def _as_element(ctx: GraphLowering, op: Any, k: int) -> Iterator[None]:
    node = ctx.current
    vals = node.meta.get("val")
    ctx.current = _Element(op, vals[k] if isinstance(vals, (list, tuple)) else vals)
    try:
        yield
    finally:
        ctx.current = node


def _element_users(node: Any) -> dict[int, int]:
    """Users of each element of a foreach node's result (through its ``getitem``s)."""
    users: dict[int, int] = {}
    for user in node.users:
        if user.target is operator.getitem:
            users[user.args[1]] = users.get(user.args[1], 0) + len(user.users)
    return users


def _foreach(ctx: GraphLowering, op: Any, count: int,
             element: Callable[[int], tuple[tuple, dict]]) -> list[Any]:
    """Lower ``op`` for each of ``count`` elements (``element(k)`` gives its arguments);
    an element used more than once that is costly to recompute is realized, as
    :meth:`GraphLowering._maybe_realize` does for a node."""
    lower = LOWERINGS.get(op)
    if lower is None:
        raise Unsupported(f"no device lowering for the element op {op}")
    users = _element_users(ctx.current)
    results = []
    for k in range(count):
        args, kwargs = element(k)
        with _as_element(ctx, op, k):
            value = lower(ctx, *args, **kwargs)
            if isinstance(value, Lazy) and users.get(k, 0) > 1 and count_ops(
                    value.load([f"i{d}" for d in range(value.ndim)]),
                    INLINE_MAX_OPS + 1) > INLINE_MAX_OPS:
                value = ctx.realize(value)
        results.append(value)
    return results


def _item(values: Any, k: int) -> Any:
    """Element ``k`` of a per-element argument: a list item, a row of a 1-d tensor of
    scalars (``_foreach_addcmul.Tensor``), or the one value every element shares."""
    if isinstance(values, (list, tuple)):
        return values[k]
    if isinstance(values, TensorValue) and values.ndim == 1:
        return select(values, 0, k)
    return values


# --------------------------------------------------------------------------- registrations

#: foreach name -> the single-tensor op each element is, for (Tensor, other) overloads
_BINARY = {
    "add": aten.add.Tensor, "sub": aten.sub.Tensor, "mul": aten.mul.Tensor,
    "div": aten.div.Tensor, "maximum": aten.maximum.default,
    "minimum": aten.minimum.default, "clamp_min": aten.clamp_min.Tensor,
    "clamp_max": aten.clamp_max.Tensor,
}
_UNARY = ("sqrt", "neg", "reciprocal", "abs", "exp", "log", "sign", "sigmoid", "tanh",
          "rsqrt", "sin", "cos", "log1p", "expm1", "floor", "ceil", "round", "trunc")


def _binary(single: Any) -> Callable[..., list[Any]]:
    def lower(ctx: GraphLowering, xs: list, other: Any, **kwargs: Any) -> list[Any]:
        return _foreach(ctx, single, len(xs), lambda k: ((xs[k], _item(other, k)), kwargs))
    return lower


def _unary(single: Any) -> Callable[..., list[Any]]:
    def lower(ctx: GraphLowering, xs: list) -> list[Any]:
        return _foreach(ctx, single, len(xs), lambda k: ((xs[k],), {}))
    return lower


for _name, _single in _BINARY.items():
    _packet = getattr(aten, f"_foreach_{_name}")
    for _overload in ("List", "Scalar", "ScalarList", "Tensor"):
        if _overload in _packet.overloads():
            register(getattr(_packet, _overload))(_binary(_single))
for _name in _UNARY:
    register(getattr(aten, f"_foreach_{_name}").default)(_unary(getattr(aten, _name).default))


@register(aten._foreach_pow.List, aten._foreach_pow.Scalar, aten._foreach_pow.ScalarList)
def _pow(ctx: GraphLowering, xs: list, exponent: Any) -> list[Any]:
    op = (aten.pow.Tensor_Tensor if ctx.current.target is aten._foreach_pow.List
          else aten.pow.Tensor_Scalar)
    return _foreach(ctx, op, len(xs), lambda k: ((xs[k], _item(exponent, k)), {}))


@register(aten._foreach_pow.ScalarAndTensor)
def _pow_scalar_base(ctx: GraphLowering, base: Any, exponents: list) -> list[Any]:
    return _foreach(ctx, aten.pow.Scalar, len(exponents),
                    lambda k: ((base, exponents[k]), {}))


class _ElementOp:
    """A registry key for an element op with no single ATen op to reuse (addcmul and
    addcdiv are decomposed before lowering; lerp's element is torch's two-sided form)."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __repr__(self) -> str:
        return self.__name__


def _addc(combine: str) -> Callable[..., Any]:
    """``self + value * t1 * t2`` (addcmul, torch's order) or ``self + value * (t1 / t2)``."""
    def lower(ctx: GraphLowering, x: Any, t1: Any, t2: Any, value: Any) -> Lazy:
        if combine == "mul":
            term = elementwise(ctx, "mul", [elementwise(ctx, "mul", [value, t1]), t2])
        else:
            term = elementwise(ctx, "mul", [value, elementwise(ctx, "truediv", [t1, t2])])
        return elementwise(ctx, "add", [x, term])
    return lower


def _foreach_addc(single: _ElementOp) -> Callable[..., list[Any]]:
    def lower(ctx: GraphLowering, xs: list, t1: list, t2: list, value: Any = 1) -> list[Any]:
        return _foreach(ctx, single, len(xs),
                        lambda k: ((xs[k], t1[k], t2[k], _item(value, k)), {}))
    return lower


for _combine in ("mul", "div"):
    _single = _ElementOp(f"addc{_combine}")
    LOWERINGS[_single] = _addc(_combine)
    _packet = getattr(aten, f"_foreach_addc{_combine}")
    for _overload in ("Scalar", "ScalarList", "Tensor"):
        register(getattr(_packet, _overload))(_foreach_addc(_single))


def _lerp_element(ctx: GraphLowering, start: Any, end: Any, weight: Any) -> Lazy:
    """torch's lerp: ``start + w * (end - start)`` for ``|w| < 0.5``, else
    ``end - (end - start) * (1 - w)`` (the form torch's decomposition uses)."""
    diff = elementwise(ctx, "sub", [end, start])
    small = elementwise(ctx, "lt", [elementwise(ctx, "abs", [weight]), 0.5],
                        compute=ctx.out_dtype(), op_dtype="bool")
    low = elementwise(ctx, "add", [start, elementwise(ctx, "mul", [weight, diff])])
    one_minus = elementwise(ctx, "sub", [1, weight])
    high = elementwise(ctx, "sub", [end, elementwise(ctx, "mul", [diff, one_minus])])
    return LOWERINGS[aten.where.self](ctx, small, low, high)


_LERP = _ElementOp("lerp")
LOWERINGS[_LERP] = _lerp_element


@register(aten._foreach_lerp.List, aten._foreach_lerp.Scalar, aten._foreach_lerp.ScalarList)
def _lerp(ctx: GraphLowering, xs: list, ends: list, weight: Any) -> list[Any]:
    return _foreach(ctx, _LERP, len(xs), lambda k: ((xs[k], ends[k], _item(weight, k)), {}))


@register(aten._foreach_copy.default)
def _copy(ctx: GraphLowering, xs: list, src: list, non_blocking: bool = False) -> list[Any]:
    return _foreach(ctx, aten.copy.default, len(xs), lambda k: ((xs[k], src[k]), {}))


@register(aten._foreach_zero.default)
def _zero(ctx: GraphLowering, xs: list) -> list[Any]:
    return _foreach(ctx, aten.zeros_like.default, len(xs), lambda k: ((xs[k],), {}))

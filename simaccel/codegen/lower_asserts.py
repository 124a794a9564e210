"""``_assert_scalar``: a runtime assertion on sizes, checked by the program.

Dynamo and AOTAutograd keep the facts a graph relies on about its data-dependent sizes
as ``_assert_scalar(u0 >= 0, "Runtime assertion failed ...")``. The condition is a size
expression; the program evaluates it with its other size expressions, once per new size
tuple (:class:`simaccel.runtime.layout.Layouts`), and a call whose sizes break it raises
with the assertion's message. A condition the shape env proves needs no check; one that
is not a size expression (a value computed on the device) stays a host op."""
from __future__ import annotations

import re
from typing import Any

import torch

from simaccel.codegen.graph import GraphLowering, Unsupported
from simaccel.codegen.registry import register
from simaccel.codegen.sizes import SYMBOL_NAME, known_true
from simaccel.runtime.sizes import SIZE_FUNCTIONS

aten = torch.ops.aten


def condition_source(condition: Any) -> str | None:
    """``condition`` (a SymBool over sizes) as a Python expression the runtime can
    evaluate, or None if it names anything else."""
    if not isinstance(condition, torch.SymBool):
        return None
    text = str(condition)
    names = set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text)) - set(SIZE_FUNCTIONS)
    if any(not SYMBOL_NAME.fullmatch(name) for name in names):
        return None
    return text


@register(aten._assert_scalar.default)
def _assert_scalar(ctx: GraphLowering, condition: Any, message: str) -> None:
    if condition is True or known_true(condition):
        return None
    source = condition_source(condition)
    if source is None:
        raise Unsupported(f"the asserted condition {condition!r} is not a size expression")
    ctx.size_asserts.append((source, message))
    return None

"""The shape env of the frame being compiled: the guards a backend's size decisions add.

A lowering that must decide a fact about a dynamic size (``size == 1`` when the shape
env cannot prove it either way, ``int(size)`` for an op that needs a concrete size) adds
a guard to the frame's shape env, as Inductor's do; the backend lists those guards in
the graph's compile report.
"""
from __future__ import annotations

from typing import Any


def _shape_env() -> Any:
    from torch._guards import TracingContext
    context = TracingContext.try_get()
    mode = getattr(context, "fake_mode", None) if context is not None else None
    return getattr(mode, "shape_env", None)


def shape_guard_count() -> int:
    """How many guards the frame's shape env holds now (0 outside a compile)."""
    env = _shape_env()
    return len(env.guards) if env is not None else 0


def shape_guards_since(count: int) -> list[str]:
    """The shape-env guards added after :func:`shape_guard_count` returned ``count``, as
    text (``Eq(s0, 3)``, ``s1 >= 5``...)."""
    env = _shape_env()
    return [str(g.expr) for g in env.guards[count:]] if env is not None else []

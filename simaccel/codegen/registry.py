"""The lowering registry: ATen op -> lowering function (Inductor's pattern).

This module imports nothing from the lowerings: the lowering modules import it and
register themselves, and the package ``simaccel.codegen`` imports them all (so the table
is full whenever any codegen module is imported, with no import circle).
"""
from __future__ import annotations

from typing import Any, Callable

#: ATen op overload -> ``fn(ctx, *args, **kwargs)``
LOWERINGS: dict[Any, Callable[..., Any]] = {}


def register(*ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn`` as the lowering of ``ops`` (an op packet registers every
    overload not registered yet)."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            if hasattr(op, "overloads"):  # an OpOverloadPacket: every overload
                for name in op.overloads():
                    LOWERINGS.setdefault(getattr(op, name), fn)
            else:
                LOWERINGS[op] = fn
        return fn
    return wrap

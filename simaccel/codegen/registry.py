"""The lowering registry: ATen op -> lowering function (Inductor's pattern).

This module imports nothing from the lowerings: the lowering modules import it and
register themselves, and the package ``simaccel.codegen`` imports them all (so the table
is full whenever any codegen module is imported, with no import circle).
"""
from __future__ import annotations

from typing import Any, Callable

#: ATen op overload -> ``fn(ctx, *args, **kwargs)``
LOWERINGS: dict[Any, Callable[..., Any]] = {}
#: ops whose lowering decides which dtypes it takes (library calls take complex buffers);
#: the graph walk checks every other op's dtypes against the device's first.
OWN_DTYPES: set[Any] = set()


def register(*ops: Any, own_dtypes: bool = False
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn`` as the lowering of ``ops`` (an op packet registers every
    overload not registered yet); ``own_dtypes``: see :data:`OWN_DTYPES`."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            overloads = [getattr(op, name) for name in op.overloads()] \
                if hasattr(op, "overloads") else [op]  # a packet: every overload
            for overload in overloads:
                if overload in LOWERINGS and hasattr(op, "overloads"):
                    continue
                LOWERINGS[overload] = fn
                if own_dtypes:
                    OWN_DTYPES.add(overload)
                else:
                    OWN_DTYPES.discard(overload)
        return fn
    return wrap

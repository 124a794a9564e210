"""Plain records the guards layer passes around (no Dynamo internals here).

:mod:`simaccel.guards.dynamo` fills them from Dynamo's state; :mod:`simaccel.guards.lift`
and :mod:`simaccel.guards.device` read them.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ScalarSite:
    """A value guard of the frame: a Python value Dynamo baked in and guards on by value.

    ``kind`` is ``float``, ``int``, ``bool``, ``str``, ``None``, ``enum`` or a type name;
    ``where`` says where the value lives (argument, global, closure cell, nn.Module
    attribute, object attribute, dict item, list item, ...). For an attribute, ``owner``
    is the class of the object holding it and ``attr`` its name.
    """

    source: str
    value: Any
    kind: str
    where: str
    guard: str
    owner: type | None = None
    attr: str = ""

    @property
    def liftable(self) -> bool:
        """A finite float or an int (not bool): what Dynamo can turn into a graph input."""
        if self.kind == "float":
            return math.isfinite(self.value)
        return self.kind == "int"


@dataclass(frozen=True)
class LiftOutcome:
    """How one requested source came out of the re-trace.

    ``status``: ``input`` (a graph placeholder), ``guard_only`` (not in the graph, only a
    predicate guard uses it), ``shape`` (its symbol became part of a tensor shape),
    ``specialized`` (Dynamo pinned it to its value, e.g. ``range(n)``), or ``not_lifted``.
    """

    source: str
    status: str
    placeholder: str | None = None
    input_index: int | None = None
    example: Any = None
    predicates: tuple[str, ...] = ()


@dataclass
class RetraceRequest:
    """Sources simaccel asked Dynamo to lift in the compile ``compile_id``.

    ``before`` holds the readable guards of the first trace; ``demoted`` the sources not
    lifted (taken back out after a re-trace, or never asked for), with the reason.
    ``rounds`` counts re-traces asked. ``first_break`` is where the first trace's graph
    ended (:func:`simaccel.guards.dynamo.graph_end`): a re-trace must end there too.
    ``on_failure(request, error, suspects)`` is called when a re-trace fails (Dynamo or
    the backend raised; ``suspects``: the requested sources the error involves, may be
    empty): it raises Dynamo's restart to trace again, or returns to let the error pass.
    ``warnings`` collects what the compile reports; ``warned`` is set once it logged its
    one WARNING line.
    """

    compile_id: str
    sites: dict[str, ScalarSite]
    before: dict[str, tuple[str, ...]]
    demoted: dict[str, str] = field(default_factory=dict)
    rounds: int = 1
    first_break: Any = None
    on_failure: Callable[[Any, BaseException, tuple[str, ...]], None] | None = None
    warnings: list[str] = field(default_factory=list)
    warned: bool = False
    undo_config: list[Callable[[], None]] = field(default_factory=list)
    undo_frame_state: list[Callable[[], None]] = field(default_factory=list)


@dataclass(frozen=True)
class GraphInput:
    """One Dynamo graph input (position ``index`` in ``example_inputs``).

    ``source`` is its source name (``None`` if it has none); ``value`` the value behind the
    source in this frame (a real tensor, a Python int, ...; the example if unreadable).
    ``tensor_property`` is ``(base source, "size"|"stride"|"storage_offset", dim)`` for an
    input that is a tensor's size/stride symbol (``L['x'].size()[0]``).
    """

    index: int
    source: str | None
    value: Any
    tensor_property: tuple[str, str, int | None] | None = None


def value_kind(value: Any) -> str:
    """Kind of a baked value as reports name it: ``None``, ``enum`` or its type's name."""
    if value is None:
        return "None"
    if isinstance(value, enum.Enum):
        return "enum"
    return type(value).__name__

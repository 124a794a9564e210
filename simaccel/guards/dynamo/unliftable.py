"""Sources of a frame found unliftable, remembered so later compiles skip their re-traces;
and the values each compile of a frame saw, to tell which scalar changed.

A source Dynamo used as a tensor shape or pinned to its value costs the compile that finds
out one more re-trace. Later compiles of the same frame skip such sources: in this process
through :class:`UnliftablePerCode`, in a later process through the file-backed
:mod:`simaccel.guards.lift_memory`.

A scalar the first trace's graph does not use is not lifted at once; when a later compile
of the frame sees it changed (:func:`changed_sources`), it is, as Dynamo's automatic
dynamic makes a scalar dynamic after its first change.
"""
from __future__ import annotations

import types
import weakref
from collections.abc import Mapping
from typing import Any

from simaccel.guards import lift_memory
from simaccel.guards.dynamo.frame import current_code


class UnliftablePerCode:
    """{source: reason} (or {source: value}) per root code object of a frame, for the
    life of the process.

    An entry is tied to the code's Dynamo frame state (``pgo.CodeState``), which
    ``torch._dynamo.reset()`` drops: a reset forgets the entry too, so a fresh Dynamo
    re-learns what it cannot lift (as it re-learns automatic-dynamic sizes). Code objects
    are held weakly.
    """

    def __init__(self) -> None:
        self._by_code: weakref.WeakKeyDictionary[
            types.CodeType, tuple[weakref.ref[Any], dict[str, str]]] = (
            weakref.WeakKeyDictionary())

    def known(self, code: types.CodeType, state: Any) -> dict[str, Any]:
        """The sources recorded for ``code`` while its frame state was ``state``."""
        ref, reasons = self._by_code.get(code, (None, {}))
        return dict(reasons) if ref is not None and ref() is state else {}

    def add(self, code: types.CodeType, state: Any, reasons: Mapping[str, Any]) -> None:
        """Record ``reasons`` for ``code`` (an entry of an older frame state is replaced)."""
        merged = {**self.known(code, state), **reasons}
        self._by_code[code] = (weakref.ref(state), merged)


unliftable_per_code = UnliftablePerCode()
#: the scalar values earlier compiles of each frame saw
values_per_code = UnliftablePerCode()


def _root_frame() -> tuple[types.CodeType, Any]:
    """The root code object of the compile and its Dynamo frame state (``CodeState``)."""
    from torch._dynamo import pgo
    code, closure = current_code()
    return code, pgo.get_code_state()[pgo.CodeId.make(code, closure)]


def remember_unliftable(reasons: Mapping[str, str]) -> None:
    """Record, for the frame being compiled, sources that must stay specialized (in this
    process, and on disk for the next one: :mod:`simaccel.guards.lift_memory`)."""
    if reasons:
        code, state = _root_frame()
        unliftable_per_code.add(code, state, reasons)
        lift_memory.store(code, reasons)


def unliftable() -> dict[str, str]:
    """Sources of the frame being compiled found unliftable by an earlier compile (of this
    process, or of an earlier process sharing the cache directory)."""
    code, state = _root_frame()
    return {**lift_memory.load(code), **unliftable_per_code.known(code, state)}


def changed_sources(values: Mapping[str, Any]) -> set[str]:
    """Of ``values`` ({source: value} of the frame being compiled), the sources an earlier
    compile of this frame saw with another value; records ``values`` for later compiles."""
    code, state = _root_frame()
    seen = values_per_code.known(code, state)
    changed = {name for name, value in values.items()
               if name in seen and not _same(seen[name], value)}
    values_per_code.add(code, state, values)
    return changed


def _same(old: Any, new: Any) -> bool:
    if type(old) is not type(new):
        return False
    return old == new or (old != old and new != new)  # NaN is NaN

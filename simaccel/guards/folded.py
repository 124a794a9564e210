"""One Python function for a frame's Python-level guard checks (no Dynamo internals here).

Without folding, a lifted frame ran three Python guard functions on every call: Dynamo's
shape-env lambda (``not math.isnan(L['a'])`` for each lifted float, simaccel's int-slot
range ``-2147483648 <= L['n'] <= 2147483647`` for each lifted int, predicates such as
``L['alpha'] > 0.0``), and one lambda per frame-level simaccel guard (the device config).
Each is a C++ -> Python call (~60-100 ns on the 2-core bench machine), while a check
inside a function costs ~15-35 ns. :func:`build_folded_check` writes all of them as one
function, so the frame pays for a single call; :mod:`simaccel.guards.dynamo` installs it
where Dynamo would have installed its shape-env lambda (after all other guards passed).

A failing part raises :class:`FoldedCheckFailed` carrying that part's text. Dynamo's C++
lambda leaf counts an exception as a failed guard and reports its text as the recompile
reason, so the reason still names the exact check, as it did with separate lambdas. The
exception never reaches users: the C++ leaf clears it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Rewrites one expression for common-subexpression elimination: returns the lines that
# bind the shared subexpressions (``_var0 = L['self'].net``) and the rewritten expression.
CseRewrite = Callable[[str], tuple[list[str], str]]

_FAIL = "___simaccel_folded_failed"


class FoldedCheckFailed(Exception):
    """A part of a folded check was false; ``str()`` is the part's guard text.

    Internal signal to Dynamo's C++ guard leaf (which catches it); not a user error, hence
    not in :mod:`simaccel.errors`.
    """


@dataclass(frozen=True)
class FoldedPart:
    """One check of a folded function.

    ``expr``: a Python expression over ``L`` (the frame's locals), ``G`` (the frame's
    globals) and the closure names given to :func:`build_folded_check`; true while the
    guard holds. ``text``: the guard as Dynamo's printout and recompile reasons show it.
    """

    expr: str
    text: str


def build_folded_check(parts: Sequence[FoldedPart], closure: Mapping[str, object],
                       global_scope: Mapping[str, object],
                       cse: CseRewrite | None = None) -> Callable[[Any], bool]:
    """A function ``check(L) -> True`` evaluating ``parts`` in order.

    Raises :class:`FoldedCheckFailed` (text of the first false part) instead of returning
    False; an exception raised by a part itself propagates unchanged (Dynamo treats it as
    a failed guard too). ``closure`` maps names used in the expressions to their objects
    (identifiers only); ``global_scope`` becomes the function's globals.
    """
    texts = tuple(part.text for part in parts)

    def failed(index: int) -> FoldedCheckFailed:
        return FoldedCheckFailed(texts[index])

    names = {**closure, _FAIL: failed}
    source = _source(parts, list(names), cse)
    namespace: dict[str, Any] = {}
    exec(compile(source, "<simaccel folded guard>", "exec"), dict(global_scope), namespace)
    check = namespace["___make_folded_check"](*names.values())
    check.__qualname__ = "simaccel_folded_check"
    return check


def _source(parts: Sequence[FoldedPart], closure_names: list[str],
            cse: CseRewrite | None) -> str:
    lines = [f"def ___make_folded_check({', '.join(closure_names)}):",
             "    def folded_check(L):"]
    for index, part in enumerate(parts):
        preface, expr = cse(part.expr) if cse is not None else ([], part.expr)
        lines.extend(f"        {line}" for line in preface)
        lines.append(f"        if not ({expr}):")
        lines.append(f"            raise {_FAIL}({index})")
    lines.append("        return True")
    lines.append("    return folded_check")
    return "\n".join(lines) + "\n"

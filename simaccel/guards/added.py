"""Backend-added guards: a guard on a frame value that Dynamo itself does not guard.

A :class:`Guard` names a frame source and a ``check(value) -> bool``. While Dynamo compiles
a frame, :func:`add_guard` evaluates the check on the source's current value and installs a
guard that passes while the check gives that same result: a change of the result makes
Dynamo recompile the frame (once; the new compile records the new result), and a compile
can never fail its own guard. The guard is a LAMBDA_GUARD leaf in Dynamo's guard manager
tree, next to Dynamo's own guards on that source, so a call pays only for the check. A
frame-level guard (``source=None``) runs inside the frame's one folded Python check, with
Dynamo's shape-env guards (:mod:`simaccel.guards.folded`).

Who adds guards: users through ``options={"guards": [...]}``, simaccel for the device facts
its artifacts specialize on (:mod:`simaccel.guards.device`), and backend passes by calling
:func:`add_guard` while the frame compiles. All of them are listed per frame compile
(:func:`frame_added_guards`) and in the ``added guards`` section of the GuardReport.
"""
from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from simaccel.errors import GuardCheckError, InvalidOptionError
from simaccel.guards import dynamo
from simaccel.guards.report import AddedGuard

__all__ = ["Guard", "add_frame_expression", "add_guard", "add_user_guards",
           "frame_added_guards"]

log = logging.getLogger("simaccel")


@dataclass(frozen=True, eq=False)
class Guard:
    """A guard on a frame source: ``Guard("L['x']", lambda x: x.is_contiguous(), "contig")``.

    ``source``: a source name as Dynamo prints it: ``L['x']`` (argument), ``G['CFG']``
    (global), with ``.attr`` and ``[constant]`` steps (``L['self'].scale``,
    ``G['CFG']['mode']``); ``None`` guards the frame itself and ``check`` receives the
    frame's locals (a dict) - for facts that are not frame values, e.g. a device setting.
    ``check(value)``: any truthy/falsy result; it runs on every call of the compiled frame,
    so keep it cheap and free of side effects. ``name`` identifies the guard in Dynamo's
    guard printout, in recompile reasons, in reports and in errors. ``description`` replaces
    ``check_name(source)`` in those texts (e.g. ``"L['x'].data_ptr() % 256 == 0"``).
    """

    source: str | None
    check: Callable[[Any], object]
    name: str
    description: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidOptionError(f"Guard name must be a non-empty str, got {self.name!r}")
        if self.source is not None and not isinstance(self.source, str):
            raise InvalidOptionError(
                f"guard {self.name!r}: source must be a str such as \"L['x']\" or None, "
                f"got {self.source!r}")
        if not callable(self.check):
            raise InvalidOptionError(
                f"guard {self.name!r}: check must be callable, got {self.check!r}")

    def describe(self, source: str) -> str:
        """The guarded expression as text (the source as Dynamo names it)."""
        if self.description is not None:
            return self.description
        check_name = getattr(self.check, "__qualname__", None) or type(self.check).__name__
        check_name = check_name.replace(".<locals>", "")
        return f"{check_name}({source or 'frame locals'})"


@dataclass
class _FrameGuards:
    """Guards added in one frame compile, in order, and by (name, source) for de-duplication."""

    added: list[AddedGuard] = field(default_factory=list)
    by_key: dict[tuple[str, str], AddedGuard] = field(default_factory=dict)


# Guards installed at least once (in any frame): if such a guard's check raises when a
# compile evaluates it, the value of a call made it raise (GuardCheckError), whereas a
# guard that never compiled is simply broken (InvalidOptionError).
_INSTALLED: weakref.WeakSet[Guard] = weakref.WeakSet()


def add_guard(guard: Guard, *, added_by: str = "backend",
              missing_ok: bool = False) -> AddedGuard | None:
    """Install ``guard`` on the frame Dynamo is compiling; returns what was installed.

    Call it inside a backend's CompilerFn (also from passes run by it, e.g. inside
    AOTAutograd's forward compiler). Adding the same name on the same source twice in one
    frame compile installs it once. ``added_by`` says who added it (for the report).
    ``missing_ok``: a source this frame does not have skips the guard (returns ``None``).

    Raises :class:`InvalidOptionError` naming the guard for a source the frame does not
    have or a check that raises; :class:`GuardCheckError` if a guard that compiled before
    raises on this frame's value; :class:`SimAccelError` outside a frame compile.
    """
    if not isinstance(guard, Guard):
        raise InvalidOptionError(f"guards must be simaccel.Guard objects, got {guard!r}")
    dynamo.assert_supported_torch()
    frame = dynamo.frame_slot(_FrameGuards)
    try:
        source = dynamo.resolve_source(guard.source)
    except (LookupError, ValueError) as err:
        if missing_ok and isinstance(err, LookupError):
            log.debug("simaccel: guard %r skipped here: %s", guard.name, err)
            return None
        raise InvalidOptionError(
            f"guard {guard.name!r}: unknown source {guard.source!r}: {err}") from err
    source_name = source.name
    existing = frame.by_key.get((guard.name, source_name))
    if existing is not None:
        return existing
    expected = _compile_time_result(guard, source_name, dynamo.frame_value(source))
    description = guard.describe(source_name)
    code_part = f"{guard.name}: " + (description if expected else f"not ({description})")
    dynamo.install_lambda_guard(source, _guard_fn(guard, source_name, expected), code_part)
    record = AddedGuard(guard.name, source_name, code_part, expected, added_by)
    frame.added.append(record)
    frame.by_key[(guard.name, source_name)] = record
    _INSTALLED.add(guard)
    return record


def add_user_guards(guards: Iterable[Guard]) -> list[AddedGuard]:
    """The guards of ``options={"guards": [...]}`` for the frame being compiled.

    The options apply to every frame compiled with them: the function itself, but also
    Dynamo's continuation after a graph break and callees compiled on their own, whose
    locals differ. A source missing from the first frame a guard meets is an error (a
    typo); once the guard has been installed somewhere, or in a graph-break continuation,
    a frame without its source just skips it.
    """
    added = []
    for guard in guards:
        lenient = isinstance(guard, Guard) and (guard in _INSTALLED or dynamo.in_resume_frame())
        record = add_guard(guard, added_by="user", missing_ok=lenient)
        if record is not None:
            added.append(record)
    return added


def add_frame_expression(name: str, template: str, objects: Mapping[str, object],
                         description: str, *, added_by: str = "simaccel",
                         source: str = "", result: bool = True) -> AddedGuard:
    """A guard written as a Python expression instead of a ``check`` function.

    For simaccel's own facts (the device config, an input's alignment): the expression
    runs inline in the frame's folded guard check, with no function call of its own (see
    :func:`simaccel.guards.dynamo.install_frame_expression` for ``template`` and
    ``objects``). It must hold at compile time and must not raise, which is why user
    guards keep a ``check`` function (a raising check is reported by its name).
    ``source`` names the frame value the expression reads, for the report ("" = the frame);
    ``result`` is the compile-time result of the check the expression guards (the
    expression itself is true now: it is ``not (...)`` of a check found false).
    """
    frame = dynamo.frame_slot(_FrameGuards)
    existing = frame.by_key.get((name, source))
    if existing is not None:
        return existing
    code_part = f"{name}: {description}"
    dynamo.install_frame_expression(template, objects, code_part)
    record = AddedGuard(name, source, code_part, result, added_by)
    frame.added.append(record)
    frame.by_key[(name, source)] = record
    return record


def add_source_expression(name: str, source: str, check: str, *,
                          added_by: str = "simaccel") -> AddedGuard | None:
    """A guard on one frame value written as a Python expression over its source name,
    e.g. ``check = "L['x'].data_ptr() % 64 == 0"``: installed so that the calls pass while
    ``check`` keeps its compile-time result (as :func:`add_guard` does for a check
    function). It must not raise once Dynamo's own guards on the value passed (it runs
    after them, in the frame's folded check).

    Inline, it costs ~30 ns per call instead of the ~150 ns of a LAMBDA_GUARD on the
    source's manager (a C++ -> Python call each). Only a plain source chain (``L[...]``/
    ``G[...]`` with ``.attr`` and ``[constant]`` steps) is a Python expression the folded
    check can evaluate; for any other source, or one the frame cannot read, returns None
    and the caller installs a :class:`Guard` instead.
    """
    if "{" in source or "}" in source:
        return None  # the expression is a format template
    try:
        dynamo.resolve_source(source)  # ValueError for anything but a plain chain
    except (LookupError, ValueError):
        return None
    result = bool(dynamo.eval_frame_expression(check))
    expr = check if result else f"not ({check})"
    return add_frame_expression(name, expr, {}, expr, added_by=added_by, source=source,
                                result=result)


def record_shape_env_guard(name: str, source: str, text: str, result: bool) -> AddedGuard:
    """List a guard simaccel installed through Dynamo's symbolic-shape guards (no lambda
    of its own) in this frame's added guards, so reports show it by name."""
    frame = dynamo.frame_slot(_FrameGuards)
    existing = frame.by_key.get((name, source))
    if existing is not None:
        return existing
    record = AddedGuard(name, source, f"{name}: {text}  [symbolic-shape guard]", result,
                        "simaccel")
    frame.by_key[(name, source)] = record
    frame.added.append(record)
    return record


def frame_added_guards() -> list[AddedGuard]:
    """The guards added so far in this frame compile: a live list (later additions, e.g.
    by passes inside AOTAutograd's compilers, appear in it too)."""
    return dynamo.frame_slot(_FrameGuards).added


def _compile_time_result(guard: Guard, source: str, value: Any) -> bool:
    try:
        return bool(guard.check(value))
    except Exception as err:  # noqa: BLE001 - any error of user code is reported by name
        what = f"{type(err).__name__}: {err}"
        if guard in _INSTALLED:
            raise GuardCheckError(
                f"simaccel guard {guard.name!r} on {source}: check raised {what} for the "
                f"value of this call (Dynamo treats a raising guard as failed and "
                f"recompiled the frame; the check raised again)") from err
        raise InvalidOptionError(
            f"guard {guard.name!r} on {source}: check raised {what} at compile time") from err


def _guard_fn(guard: Guard, source: str, expected: bool) -> Callable[[Any], object]:
    """The function the C++ leaf calls: true while ``check`` gives ``expected``.

    An exception becomes a :class:`GuardCheckError` naming the guard: Dynamo counts the
    guard as failed and shows that text as the recompile reason.
    """
    check = guard.check
    name = guard.name

    def named_error(err: Exception) -> GuardCheckError:
        return GuardCheckError(f"simaccel guard {name!r} on {source}: check raised "
                               f"{type(err).__name__}: {err}")

    if expected:
        def guard_fn(value: Any) -> object:
            try:
                return check(value)
            except Exception as err:
                raise named_error(err) from err
    else:
        def guard_fn(value: Any) -> object:
            try:
                return not check(value)
            except Exception as err:
                raise named_error(err) from err
    guard_fn.__qualname__ = f"simaccel_guard[{name}]"
    return guard_fn

"""Floats lifted on a frame's first trace, with no re-trace.

In torch 2.13 a float Dynamo reads from a source (``specialize_float`` is False by
default) goes through ``VariableBuilder.wrap_symfloat``, which bakes it in with a
CONSTANT_MATCH guard only because its frame-state entry (from
``pgo.process_automatic_dynamic``) is not ``auto_dynamic`` yet: Dynamo's automatic
dynamic sets that entry after the value's first change. For a frame simaccel compiles
with lifting on, a float the backend chooses (``decide(options, site, unliftable)``,
:mod:`simaccel.guards.first_trace`) gets the ``auto_dynamic`` entry on the first trace:
it becomes a graph input at once (a 0-d float64 tensor read with ``.item()``), what a
lifting re-trace would make of it, and the re-trace is saved (~0.5 s a frame on a
6-layer transformer). The entry is not stored in the frame state: each trace of a
simaccel frame asks again, and another backend's frames are never touched.

What the trace made of each float (graph input, pinned by a use such as ``int()``, part
of a tensor shape) is read afterwards as for a re-trace (:func:`.lifted.inspect_lifted`).
A float that must stay specialized is :meth:`FirstTraceFloats.refuse`\\ d and the frame
traced again (:func:`.retrace.restart_trace`).

Lifetime: one :class:`FirstTraceFloats` per compile of a frame (Dynamo's compile id),
dropped when Dynamo's compile ends.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from simaccel.guards.dynamo.failures import install_failure_hook, involved_sources
from simaccel.guards.dynamo.frame import (
    attribute_owner, call_at_compile_end, current_compile_id, resolve_source, where,
)
from simaccel.guards.records import ScalarSite

log = logging.getLogger("simaccel")

_HOOK_MARK = "_simaccel_first_trace"
#: attributes that lead from a Dynamo compiler_fn to the backend it wraps
#: (WrapBackendDebug, torch.compile's wrapper, functools.partial, DDPOptimizer)
_WRAPPED_BY = ("compiler_fn", "_torchdynamo_orig_backend", "func", "__self__",
               "backend_compile_fn", "__wrapped__")
_MAX_WRAPPERS = 8
#: decide(options, site, unliftable) -> whether to lift ``site`` on the first trace
Decide = Callable[[Mapping[str, Any], ScalarSite, Mapping[str, str]], bool]


@dataclass
class FirstTraceFloats:
    """The floats made graph inputs on the traces of one frame compile.

    ``options``: the backend's options; ``unliftable``: what earlier compiles found
    unliftable in the frame; ``sites``: floats made dynamic (any trace of the compile);
    ``refused``: floats that must stay specialized in this compile, with the reason;
    ``off``: why first-trace lifting is off for the rest of the compile ("" while on);
    ``warnings``: what the compile reports about it (``warned`` once its WARNING line is
    logged); ``failures``: traces that failed with floats lifted; ``decided``: the
    decision per source, asked once a compile.
    """

    compile_id: str
    options: Mapping[str, Any]
    unliftable: Mapping[str, str]
    sites: dict[str, ScalarSite] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    off: str = ""
    warnings: list[str] = field(default_factory=list)
    warned: bool = False
    failures: int = 0
    decided: dict[str, bool] = field(default_factory=dict)

    def turn_off(self, reason: str) -> None:
        """Lift no float on the later traces of this compile."""
        self.off = reason
        self.sites.clear()

    def refuse(self, reasons: Mapping[str, str]) -> None:
        """Keep ``reasons``' sources specialized on the later traces of this compile."""
        self.refused.update(reasons)
        for name in reasons:
            self.sites.pop(name, None)


class _Hook:
    """The backend function whose frames are lifted, and its decision function."""

    backend: Any = None
    decide: Decide | None = None
    on_failure: Callable[[FirstTraceFloats, BaseException, tuple[str, ...]], None] | None = None


_by_compile: dict[str, FirstTraceFloats] = {}


def install_first_trace_lifting(backend: Any, decide: Decide,
                                on_failure: Callable[[FirstTraceFloats, BaseException,
                                                      tuple[str, ...]], None]) -> None:
    """Wrap Dynamo's ``process_automatic_dynamic`` (as the variable builder calls it)
    once per process; frames compiled by ``backend`` get ``decide``'s floats dynamic,
    and a trace of theirs that fails with floats lifted goes to ``on_failure(state,
    error, suspects)`` (:mod:`.failures`)."""
    from torch._dynamo import pgo
    from torch._dynamo.variables import builder
    _Hook.backend, _Hook.decide, _Hook.on_failure = backend, decide, on_failure
    install_failure_hook(first_trace=_on_failed_trace)
    original = builder.process_automatic_dynamic
    if getattr(original, _HOOK_MARK, False):
        return

    def process_automatic_dynamic(tx: Any, name: str, entry: Any, **kwargs: Any) -> Any:
        result = original(tx, name, entry, **kwargs)
        if (type(entry.scalar) is float and result.scalar is not pgo.auto_dynamic
                and _decide_safely(tx, name, entry.scalar)):
            return pgo.FrameStateSizeEntry(scalar=pgo.auto_dynamic)
        return result

    setattr(process_automatic_dynamic, _HOOK_MARK, True)
    process_automatic_dynamic.__wrapped__ = original  # type: ignore[attr-defined]
    builder.process_automatic_dynamic = process_automatic_dynamic


def first_trace_floats() -> FirstTraceFloats | None:
    """The state of the compile under way; None until a trace of it read a float of a
    frame the hooked backend compiles."""
    return _by_compile.get(current_compile_id())


def _on_failed_trace(tracer: Any, err: BaseException) -> None:
    """A trace failed with no re-trace pending: if it lifted floats, the backend's
    handler decides (it raises Dynamo's restart, or returns and the error goes on)."""
    state = first_trace_floats()
    if state is None or not state.sites or _Hook.on_failure is None:
        return
    suspects = involved_sources(err, tracer.output.shape_env, state.sites)
    _Hook.on_failure(state, err, suspects)


def _decide_safely(tx: Any, name: str, value: float) -> bool:
    """:func:`_lift_now`; a decision that raises lifts nothing (Dynamo's own handling,
    the re-trace path may still lift the float) and says why at INFO."""
    try:
        return _lift_now(tx, name, value)
    except Exception as err:  # noqa: BLE001 - never let the hook break Dynamo's trace
        log.info("simaccel: %s not lifted on the first trace (%s: %s)", name,
                 type(err).__name__, err)
        return False


def _lift_now(tx: Any, name: str, value: float) -> bool:
    options = backend_options(tx.output.compiler_fn)
    if options is None or _Hook.decide is None:
        return False
    state = _state(options)
    if state.off or name in state.refused:
        return False
    if name not in state.decided:
        site = _float_site(tx.output, name, value)
        state.decided[name] = site is not None and _Hook.decide(
            state.options, site, state.unliftable)
        if state.decided[name]:
            state.sites[name] = site  # type: ignore[assignment]
    return state.decided[name]


def _state(options: Mapping[str, Any]) -> FirstTraceFloats:
    from simaccel.guards.dynamo.unliftable import unliftable
    compile_id = current_compile_id()
    state = _by_compile.get(compile_id)
    if state is None:
        state = FirstTraceFloats(compile_id, options, unliftable())
        _by_compile[compile_id] = state
        call_at_compile_end(_on_compile_end)
    return state


def backend_options(compiler_fn: Any) -> Mapping[str, Any] | None:
    """The ``options`` a compile passes to the hooked backend (``{}`` when none), or None
    when ``compiler_fn`` does not lead to it (another backend, an opaque wrapper)."""
    options: Any = {}
    fn = compiler_fn
    for _ in range(_MAX_WRAPPERS):
        if fn is None:
            return None
        if fn is _Hook.backend:
            return options if isinstance(options, Mapping) else {}
        for held in (getattr(fn, "kwargs", None), getattr(fn, "keywords", None)):
            if isinstance(held, Mapping) and "options" in held:
                options = held["options"] or {}
        fn = next((getattr(fn, a) for a in _WRAPPED_BY if getattr(fn, a, None) is not None),
                  None)
    return None


def _float_site(out: Any, name: str, value: float) -> ScalarSite | None:
    """The site of the float ``name``; None for a source simaccel cannot name or read."""
    try:
        source = resolve_source(name)
    except (ValueError, LookupError):
        return None
    return ScalarSite(name, value, "float", where(out, source),
                      f"CONSTANT_MATCH: {name} == {value!r}", *attribute_owner(out, source))


def _on_compile_end(_args: Any) -> None:
    _by_compile.clear()

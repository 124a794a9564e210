"""Lift baked-in Python scalars into graph inputs, inside the frame's first compile.

The backend calls :func:`lift_scalars` at the top of its CompilerFn.  For one frame compile:

0. Floats the policy allows are graph inputs from the first trace already
   (:mod:`simaccel.guards.first_trace`): no value guard, no re-trace for them. What
   follows is for the rest (ints; floats under another backend wrapper, or kept back).
1. First trace: Dynamo baked floats/ints into the graph and guards each one by value.
   ``lift_scalars`` picks the liftable ones (policy + :func:`keep_reason`), keeps those the
   graph only uses as shapes or ``double`` hyperparameters, and the settings of modules
   and config objects it does not use at all (:mod:`simaccel.guards.graph_uses`), and
   raises Dynamo's restart exception: Dynamo
   re-traces the frame at once, in the same compile. A setting the graph did not use is
   lifted by a later compile of the frame that sees it changed, as Dynamo's automatic
   dynamic would make it dynamic after its first change.
2. Re-trace: the chosen scalars are graph inputs now.  Any that Dynamo used as a tensor
   shape must stay specialized: one more re-trace takes them back out (at most two
   re-traces for this).  One Dynamo pinned to its value (``range(n)``, a ``double``
   argument) needs no re-trace: the graph is right for its value, as under ``lift='off'``.
3. Safety: a re-trace that fails (Dynamo raises, the backend raises, a graph break moves)
   is traced again with the sources the error involves specialized (all of them on a
   second failure): at most one more trace per failure, three re-traces in all, one
   WARNING line per frame compile.
4. The graph handed back is compiled; the :class:`GuardReport` says what happened.

Nothing here touches Dynamo directly; that is :mod:`simaccel.guards.dynamo`.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from simaccel.guards import dynamo
from simaccel.guards.first_trace import error_text, read_first_trace, warn_once
from simaccel.guards.graph_uses import ABSENT, HYPERPARAMETER, SHAPE, VALUE, predict_uses
from simaccel.guards.policy import LiftPolicy, keep_reason, parse_source_path
from simaccel.guards.records import LiftOutcome, RetraceRequest, ScalarSite
from simaccel.guards.report import (
    ARRIVES_AS_GUARD_ONLY, ARRIVES_AS_SYMINT, ARRIVES_AS_TENSOR, DroppedGuard, GuardReport,
    KeptGuard, LiftedScalar,
)

log = logging.getLogger("simaccel")

#: re-traces that lift, then take shape uses back out
MAX_RETRACES = 2
#: re-traces in all, failures included (the last one lifts nothing)
MAX_RETRACES_WITH_FAILURES = 3

_DEMOTE_REASONS = {
    "shape": "used as a tensor shape/size: lifting it would make shapes dynamic",
    "specialized": "Dynamo specialized it (range bound, dim, int() or == comparison, a "
                   "float argument ATen takes as a constant, or, under another backend's "
                   "AOTAutograd, an op its tensorify pass cannot rewrite)",
    "not_lifted": "Dynamo kept it specialized on the re-trace",
}
_PREDICTED_REASONS = {
    SHAPE: "the first trace's graph uses it only as a shape, dim or index (not re-traced)",
    HYPERPARAMETER: "the first trace's graph passes it only as a constant ATen "
                    "specializes (eps, momentum, dropout p; not re-traced)",
    ABSENT: "the first trace's graph does not use it (control flow, a loop bound or a "
            "Python index); lifted once it changes, as Dynamo's automatic dynamic would",
}
_MAX_PREDICATES_SHOWN = 3


class GraphBreakMoved(Exception):
    """A lifting re-trace ended its graph elsewhere than the first trace did."""


def lift_scalars(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 lift: object = "auto", keep: object = ()) -> GuardReport:
    """Lift the frame's baked scalars into graph inputs; call it first in the CompilerFn.

    On the first trace of a compile this raises Dynamo's restart exception (let it
    propagate: Dynamo re-traces the frame and calls the backend again).  Otherwise it
    returns the report of ``gm``, whose lifted scalars are placeholders: floats as 0-d
    float64 tensors, ints as SymInts (see :class:`LiftedScalar`).

    Raises :class:`~simaccel.errors.InvalidOptionError` for a bad ``lift``/``keep``.
    """
    del example_inputs  # the placeholders' metadata says everything needed
    policy = LiftPolicy.parse(lift, keep)
    label = policy.mode if policy.mode != "patterns" else "[" + ", ".join(
        p.text for p in policy.lift) + "]"
    if policy.mode == "off":
        return _report_without_lifting(gm, label, policy)
    dynamo.assert_supported_torch()
    request = dynamo.pending_retrace()
    if request is None:
        held, early, outcomes = _first_trace(gm, policy)
        return _report(gm, label, policy, early, outcomes, tuple(early.warnings), held=held)
    return _after_retrace(gm, label, policy, request)


def _report_without_lifting(gm: torch.fx.GraphModule, label: str,
                            policy: LiftPolicy) -> GuardReport:
    """``lift='off'`` never needs Dynamo internals; report on them only if they are known."""
    try:
        dynamo.assert_supported_torch()
    except Exception as err:  # noqa: BLE001 - lifting is off, so this is not fatal
        return GuardReport(label, warnings=(f"no guard details: {err}",))
    return _report(gm, label, policy, None, {})


def _first_trace(gm: torch.fx.GraphModule, policy: LiftPolicy
                 ) -> tuple[dict[str, str], RetraceRequest, dict[str, LiftOutcome]]:
    """Ask for a re-trace if there is anything worth lifting or a float lifted on this
    trace must stay specialized (raises); else return the sources held back by what the
    graph does with them, with the reason, the floats lifted on this trace (as a request
    of no re-trace round) and what the trace made of each."""
    early = read_first_trace(gm)
    known_bad = dynamo.unliftable()
    sites = [s for s in dynamo.value_guard_sites()
             if keep_reason(s) is None and policy.decide(s.source) is None]
    changed = dynamo.changed_sources({s.source: s.value for s in sites})
    sites = [s for s in sites if s.source not in known_bad]
    uses = predict_uses(gm, [(s.source, s.value) for s in sites])
    chosen = [s for s in sites if uses[s.source] == VALUE or (
        uses[s.source] == ABSENT and (s.source in changed or not _in_an_object(s)))]
    held = {s.source: _PREDICTED_REASONS[uses[s.source]] for s in sites if s not in chosen}
    if held:
        log.info("simaccel: not lifted (from the first trace's graph): %s",
                 "; ".join(f"{n}: {r}" for n, r in held.items()))
    demoted = {**held, **early.pinned, **early.shapes}
    if not chosen and not early.shapes:
        return held, RetraceRequest(dynamo.current_compile_id(), early.sites, early.before,
                                    demoted, rounds=0, warnings=early.warnings), early.outcomes
    before = {**dynamo.readable_guards(s.source for s in chosen), **early.before}
    dynamo.request_retrace(chosen + list(early.sites.values()), before, demoted,
                           first_break=dynamo.graph_end(), on_failure=_on_failure,
                           warnings=early.warnings)


def _in_an_object(site: ScalarSite) -> bool:
    """Whether ``site`` is read through an attribute (``L['self'].config.n_layer``,
    ``L['self'].param_groups[0]['momentum']``): a module's or config object's setting. One
    the graph does not use waits for its first change; an argument, global or closure cell
    is lifted at once (Dynamo may have folded it into another constant: ``b * n``)."""
    tokens = parse_source_path(site.source) or ()
    return any(token[0] == "attr" for token in tokens)


def _after_retrace(gm: torch.fx.GraphModule, label: str, policy: LiftPolicy,
                   request: RetraceRequest) -> GuardReport:
    """Check the re-traced graph; take back out what must stay specialized (bounded)."""
    if request.first_break is not None and request.sites \
            and dynamo.graph_end() != request.first_break:
        _on_failure(request, GraphBreakMoved(
            "the graph now ends at another graph break than without lifting"), ())
    outcomes = dynamo.inspect_lifted(gm, request.sites)
    kept = {n: o for n, o in outcomes.items()
            if o.status in ("shape", "specialized", "not_lifted")}
    reasons = {n: _demote_reason(o) for n, o in kept.items()}
    dynamo.remember_unliftable({n: _DEMOTE_REASONS[o.status] + " (an earlier trace)"
                                for n, o in kept.items() if o.status != "not_lifted"})
    for name, reason in reasons.items():
        log.info("simaccel: %s stays specialized: %s", name, reason)
    shapes = {n for n, o in kept.items() if o.status == "shape"}
    if shapes and request.rounds < MAX_RETRACES:
        remaining = [s for n, s in request.sites.items() if n not in shapes]
        dynamo.request_retrace(remaining, request.before,
                               {**request.demoted, **{n: reasons[n] for n in shapes}})
    request.demoted.update(reasons)
    for name in shapes:  # out of re-traces: compiled with a symbolic shape
        warn_once(request, f"{name} could not be lifted after {request.rounds} re-trace(s): "
                           f"{reasons[name]}; compiled with a symbolic shape")
    return _report(gm, label, policy, request, outcomes, tuple(request.warnings))


def _on_failure(request: RetraceRequest, err: BaseException,
                suspects: tuple[str, ...]) -> None:
    """A re-trace failed: trace again with the sources involved (all of them on a second
    failure, or when none is identified) specialized. Raises Dynamo's restart; returns
    (the error goes on) once the re-traces are used up."""
    if request.rounds >= MAX_RETRACES_WITH_FAILURES or not request.sites:
        return
    culprits = [n for n in request.sites
                if n in suspects or not suspects or request.rounds >= MAX_RETRACES]
    text = error_text(err)
    reasons = {n: f"lifting it made the re-trace fail ({text})" for n in culprits}
    dynamo.remember_unliftable(reasons)
    warn_once(request, f"lifting {', '.join(culprits)} made the re-trace fail ({text}); "
                       f"kept specialized, as with lift='off', and traced the frame again")
    remaining = [s for n, s in request.sites.items() if n not in culprits]
    dynamo.request_retrace(remaining, request.before, {**request.demoted, **reasons})


def _demote_reason(outcome: LiftOutcome) -> str:
    reason = _DEMOTE_REASONS[outcome.status]
    if outcome.predicates:
        shown = list(outcome.predicates[:_MAX_PREDICATES_SHOWN])
        if len(outcome.predicates) > len(shown):
            shown.append(f"... {len(outcome.predicates) - len(shown)} more")
        reason += " [" + ", ".join(shown) + "]"
    return reason


def _report(gm: torch.fx.GraphModule, label: str, policy: LiftPolicy,
            request: RetraceRequest | None, outcomes: dict[str, LiftOutcome],
            warnings: tuple[str, ...] = (), held: dict[str, str] | None = None
            ) -> GuardReport:
    """Describe ``gm``: its scalar inputs, the guards dropped and the value guards kept
    (``held``: sources the first trace held back, when there was no re-trace)."""
    requested = request.sites if request is not None else {}
    lifted = _lifted(gm, requested, outcomes)
    dropped = _dropped(request, [s.source for s in lifted if s.source in requested])
    kept = _kept(policy, request, held or {}, outcomes)
    return GuardReport(label, tuple(lifted), tuple(dropped), tuple(kept),
                       retraced=request is not None and request.rounds > 0,
                       warnings=warnings)


def _lifted(gm: torch.fx.GraphModule, requested: dict[str, ScalarSite],
            outcomes: dict[str, LiftOutcome]) -> list[LiftedScalar]:
    """Every scalar graph input, plus requested scalars that only a predicate guard uses
    (not a requested one the re-trace pinned again: its input is left unused)."""
    pinned = {n for n, o in outcomes.items() if o.status in ("specialized", "not_lifted")}
    lifted = [_lifted_scalar(site, outcome, "simaccel" if site.source in requested else "dynamo")
              for site, outcome in dynamo.scalar_inputs(gm) if site.source not in pinned]
    for name, outcome in outcomes.items():
        if outcome.status == "guard_only":
            lifted.append(_lifted_scalar(requested[name], outcome, "simaccel"))
    return lifted


def _lifted_scalar(site: ScalarSite, outcome: LiftOutcome, lifted_by: str) -> LiftedScalar:
    example = outcome.example
    arrives_as = (ARRIVES_AS_GUARD_ONLY if outcome.placeholder is None
                  else ARRIVES_AS_TENSOR if isinstance(example, torch.Tensor)
                  else ARRIVES_AS_SYMINT if isinstance(example, torch.SymInt)
                  else type(example).__name__)
    return LiftedScalar(site.source, site.kind, site.where, site.value, arrives_as,
                        outcome.placeholder, outcome.input_index, outcome.predicates, lifted_by)


def _dropped(request: RetraceRequest | None, names: Iterable[str]) -> list[DroppedGuard]:
    if request is None:
        return []
    names = list(names)
    after = dynamo.readable_guards(names)
    dropped = []
    for name in names:
        before = [g for g in request.before.get(name, ())
                  if g.split(":")[0] in dynamo.VALUE_GUARDS]
        now = [g for g in after.get(name, ()) if g.split(":")[0] not in dynamo.VALUE_GUARDS]
        dropped.append(DroppedGuard(name, "; ".join(before) or "(none)",
                                    "; ".join(now) or "(no guard on the value)"))
    return dropped


def _kept(policy: LiftPolicy, request: RetraceRequest | None, held: dict[str, str],
          outcomes: dict[str, LiftOutcome]) -> list[KeptGuard]:
    """The frame's remaining value guards, each with the reason it stays; and the
    requested sources the re-trace pinned again (their guard is a shape-env guard such as
    ``Eq(L['n'], 2)`` instead of a value guard)."""
    demoted = {} if policy.mode == "off" else {
        **dynamo.unliftable(), **held, **(request.demoted if request is not None else {})}
    kept = []
    for site in dynamo.value_guard_sites():
        reason = (demoted.get(site.source) or keep_reason(site)
                  or policy.decide(site.source) or "not lifted")
        kept.append(KeptGuard(site.source, site.guard, reason))
    listed = {k.source for k in kept}
    for name, outcome in outcomes.items():
        if outcome.status == "specialized" and name not in listed:
            guard = "; ".join(outcome.predicates) or f"{name} pinned by the shape env"
            kept.append(KeptGuard(name, guard, demoted.get(name, _demote_reason(outcome))))
    return kept

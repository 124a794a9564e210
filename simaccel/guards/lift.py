"""Lift baked-in Python scalars into graph inputs, inside the frame's first compile.

The backend calls :func:`lift_scalars` at the top of its CompilerFn.  For one frame compile:

1. First trace: Dynamo baked floats/ints into the graph and guards each one by value.
   ``lift_scalars`` picks the liftable ones (policy + :func:`keep_reason`) and raises
   Dynamo's restart exception: Dynamo re-traces the frame at once, in the same compile.
2. Re-trace: the chosen scalars are graph inputs now.  Any that Dynamo used as a tensor
   shape or pinned to its value (``range(n)``, ``x.sum(dim=n)``) must stay specialized: one
   more re-trace takes them back out.  This is the bound: at most two re-traces per compile.
3. The graph handed back is compiled; the :class:`GuardReport` says what happened.

Nothing here touches Dynamo directly; that is :mod:`simaccel.guards.dynamo`.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from simaccel.guards import dynamo
from simaccel.guards.nn_constants import nn_constant_reason
from simaccel.guards.policy import LiftPolicy
from simaccel.guards.records import LiftOutcome, RetraceRequest, ScalarSite
from simaccel.guards.report import (
    ARRIVES_AS_GUARD_ONLY, ARRIVES_AS_SYMINT, ARRIVES_AS_TENSOR, DroppedGuard, GuardReport,
    KeptGuard, LiftedScalar,
)

log = logging.getLogger("simaccel")

MAX_RETRACES = 2

_DEMOTE_REASONS = {
    "shape": "used as a tensor shape/size: lifting it would make shapes dynamic",
    "specialized": "Dynamo specialized it (range bound, dim, int() or == comparison, or an "
                   "op AOTAutograd cannot tensorify such as pow/clamp/full)",
    "not_lifted": "Dynamo kept it specialized on the re-trace",
}
_MAX_PREDICATES_SHOWN = 3


def keep_reason(site: ScalarSite) -> str | None:
    """Why a value guard must stay whatever the policy says; ``None`` if it can be lifted."""
    if site.kind == "bool":
        return "bool: steers control flow"
    if site.kind in ("str", "None", "enum"):
        return f"{site.kind}: not a number, cannot be a graph input"
    if site.kind == "float" and not site.liftable:
        return "NaN/inf: Dynamo specializes non-finite floats"
    if site.kind not in ("float", "int"):
        return f"{site.kind} value: not a Python scalar"
    return nn_constant_reason(site.owner, site.attr)


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
        _first_trace(policy)
        return _report(gm, label, policy, None, {})
    return _after_retrace(gm, label, policy, request)


def _report_without_lifting(gm: torch.fx.GraphModule, label: str,
                            policy: LiftPolicy) -> GuardReport:
    """``lift='off'`` never needs Dynamo internals; report on them only if they are known."""
    try:
        dynamo.assert_supported_torch()
    except Exception as err:  # noqa: BLE001 - lifting is off, so this is not fatal
        return GuardReport(label, warnings=(f"no guard details: {err}",))
    return _report(gm, label, policy, None, {})


def _first_trace(policy: LiftPolicy) -> None:
    """Ask for a re-trace if there is anything to lift (raises), else return."""
    known_bad = dynamo.unliftable()
    chosen = [s for s in dynamo.value_guard_sites()
              if keep_reason(s) is None and policy.decide(s.source) is None
              and s.source not in known_bad]
    if not chosen:
        return
    before = dynamo.readable_guards(s.source for s in chosen)
    dynamo.request_retrace(chosen, before)


def _after_retrace(gm: torch.fx.GraphModule, label: str, policy: LiftPolicy,
                   request: RetraceRequest) -> GuardReport:
    """Check the re-traced graph; take back out what must stay specialized (bounded)."""
    outcomes = dynamo.inspect_lifted(gm, request.sites)
    demote = {n: o for n, o in outcomes.items() if o.status in ("shape", "specialized")}
    dynamo.remember_unliftable({n: _DEMOTE_REASONS[o.status] + " (an earlier trace)"
                                for n, o in demote.items()})
    if demote and request.rounds < MAX_RETRACES:
        remaining = [s for n, s in request.sites.items() if n not in demote]
        reasons = {n: _demote_reason(o) for n, o in demote.items()}
        dynamo.request_retrace(remaining, request.before, {**request.demoted, **reasons})
    return _report(gm, label, policy, request, outcomes, _final_warnings(request, outcomes))


def _final_warnings(request: RetraceRequest,
                    outcomes: dict[str, LiftOutcome]) -> tuple[str, ...]:
    """Log and list the sources the last allowed re-trace still could not lift cleanly."""
    warnings = []
    for name, outcome in outcomes.items():
        if outcome.status not in ("shape", "specialized", "not_lifted"):
            continue
        reason = _demote_reason(outcome)
        request.demoted.setdefault(name, reason)
        dynamo.remember_unliftable({name: _DEMOTE_REASONS[outcome.status] + " (an earlier trace)"})
        effect = ("compiled with a symbolic shape" if outcome.status == "shape"
                  else "stays specialized; a new value recompiles")
        warnings.append(f"{name} could not be lifted after {request.rounds} re-trace(s): "
                        f"{reason}; {effect}")
    for text in warnings:
        log.warning("simaccel: %s", text)
    return tuple(warnings)


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
            warnings: tuple[str, ...] = ()) -> GuardReport:
    """Describe ``gm``: its scalar inputs, the guards dropped and the value guards kept."""
    requested = request.sites if request is not None else {}
    lifted = _lifted(gm, requested, outcomes)
    dropped = _dropped(request, [s.source for s in lifted if s.source in requested])
    kept = _kept(policy, request)
    return GuardReport(label, tuple(lifted), tuple(dropped), tuple(kept),
                       retraced=request is not None, warnings=warnings)


def _lifted(gm: torch.fx.GraphModule, requested: dict[str, ScalarSite],
            outcomes: dict[str, LiftOutcome]) -> list[LiftedScalar]:
    """Every scalar graph input, plus requested scalars that only a predicate guard uses."""
    lifted = [_lifted_scalar(site, outcome, "simaccel" if site.source in requested else "dynamo")
              for site, outcome in dynamo.scalar_inputs(gm)]
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


def _kept(policy: LiftPolicy, request: RetraceRequest | None) -> list[KeptGuard]:
    """The frame's remaining value guards, each with the reason it stays."""
    demoted = {} if policy.mode == "off" else {
        **dynamo.unliftable(), **(request.demoted if request is not None else {})}
    kept = []
    for site in dynamo.value_guard_sites():
        reason = (demoted.get(site.source) or keep_reason(site)
                  or policy.decide(site.source) or "not lifted")
        kept.append(KeptGuard(site.source, site.guard, reason))
    return kept

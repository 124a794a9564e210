"""Floats lifted on a frame's first trace: which ones, what the trace made of them, and
what happens when that goes wrong.

A float simaccel may lift (``lift`` policy, :func:`~simaccel.guards.policy.keep_reason`,
not found unliftable by an earlier compile) is a graph input from the frame's first trace
(:mod:`simaccel.guards.dynamo.first_trace`): no value guard, no re-trace. Ints still go
the re-trace way (:mod:`simaccel.guards.lift`): Dynamo specializes nn.Module ints before
the frame state is asked, and a SymInt slicing a Python list makes a trace fail.

After the trace, :func:`read_first_trace` sorts the floats as a re-trace's are sorted:

* a graph input, or a symbol only a predicate guard uses: lifted;
* pinned to its value by a use (``int()``, a ``double`` ATen argument): the graph is
  right for its value, as under ``lift='off'``; remembered as unliftable;
* part of a tensor shape: must stay static, so the frame is re-traced with it specialized.

Safety, the same as for a re-trace: a first trace that fails with floats lifted is
traced again with the floats the error involves (all of them on a second failure, or
when none is identified) specialized; a first trace whose graph ends at a graph break is
traced again with none lifted (the break may be the lifting's doing; the re-trace path
then checks that). One WARNING line per frame compile.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from simaccel.errors import SimAccelError
from simaccel.guards import dynamo
from simaccel.guards.policy import LiftPolicy, keep_reason
from simaccel.guards.records import LiftOutcome, ScalarSite
from simaccel.options import parse_options

log = logging.getLogger("simaccel")

#: failed first traces after which every float of the frame is specialized
MAX_FIRST_TRACE_FAILURES = 2
_PINNED_REASON = ("Dynamo pinned it to its value on the first trace (int(), a float "
                  "argument ATen takes as a constant)")
_SHAPE_REASON = "used as a tensor shape/size on the first trace: lifting it would make " \
                "shapes dynamic"
_NOT_INSTALLED = "(not installed: lifted on the first trace)"


@dataclass
class FirstTraceResult:
    """What :func:`read_first_trace` found: ``sites`` lifted (a graph input or a
    predicate symbol), with the value guard each replaces in ``before``; ``pinned`` and
    ``shapes``: floats that stay specialized, with the reason; ``outcomes`` of all."""

    sites: dict[str, ScalarSite] = field(default_factory=dict)
    before: dict[str, tuple[str, ...]] = field(default_factory=dict)
    pinned: dict[str, str] = field(default_factory=dict)
    shapes: dict[str, str] = field(default_factory=dict)
    outcomes: dict[str, LiftOutcome] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def may_lift_first(options: Mapping[str, Any], site: ScalarSite,
                   unliftable: Mapping[str, str]) -> bool:
    """Whether the float ``site`` is made a graph input on the first trace of a frame
    compiled with backend ``options``; bad options lift nothing (the backend reports
    them when it is called)."""
    try:
        parsed = parse_options(dict(options))
        policy = LiftPolicy.parse(parsed.lift, parsed.keep)
    except (SimAccelError, TypeError, ValueError):
        return False
    return (policy.mode != "off" and site.liftable and site.source not in unliftable
            and keep_reason(site) is None and policy.decide(site.source) is None)


def install(backend: Any) -> None:
    """Lift floats on the first trace of frames compiled by ``backend`` (the simaccel
    CompilerFn), from now on in this process."""
    dynamo.install_first_trace_lifting(backend, may_lift_first, on_failure)


def read_first_trace(gm: torch.fx.GraphModule) -> FirstTraceResult:
    """Sort the floats lifted on this trace (see the module doc). Raises Dynamo's restart
    when the graph ended at a graph break with floats lifted."""
    state = dynamo.first_trace_floats()
    if state is None:
        return FirstTraceResult()
    result = FirstTraceResult(warnings=state.warnings)
    outcomes = dynamo.inspect_lifted(gm, state.sites) if state.sites else {}
    result.outcomes = {n: o for n, o in outcomes.items() if o.status != "not_lifted"}
    if result.outcomes and dynamo.graph_end()[0]:
        state.turn_off("the graph ended at a graph break")
        dynamo.restart_trace("simaccel: trace again without first-trace lifting "
                             "(the graph ended at a graph break)")
    for name, outcome in result.outcomes.items():
        if outcome.status == "specialized":
            result.pinned[name] = _PINNED_REASON
        elif outcome.status == "shape":
            result.shapes[name] = _SHAPE_REASON
        else:
            result.sites[name] = state.sites[name]
            result.before[name] = (f"{state.sites[name].guard} {_NOT_INSTALLED}",)
    dynamo.remember_unliftable({n: r + " (an earlier trace)"
                                for n, r in {**result.pinned, **result.shapes}.items()})
    state.refuse({**result.pinned, **result.shapes})
    return result


def on_failure(state: Any, err: BaseException, suspects: tuple[str, ...]) -> None:
    """A first trace with floats lifted failed: trace again with the floats the error
    involves specialized (every one on a second failure or when none is identified).
    Raises Dynamo's restart."""
    state.failures += 1
    identified = bool(suspects) and state.failures < MAX_FIRST_TRACE_FAILURES
    culprits = [n for n in state.sites if n in suspects or not identified]
    text = error_text(err)
    reasons = {n: f"lifting it on the first trace made the trace fail ({text})"
               for n in culprits}
    dynamo.remember_unliftable(reasons)  # later compiles of the frame skip them too
    state.refuse(reasons)
    warn_once(state, f"lifting {', '.join(culprits)} made the first trace fail ({text}); "
                     f"kept specialized, as with lift='off', and traced the frame again")
    dynamo.restart_trace(f"simaccel: trace again with {', '.join(culprits)} specialized")


def error_text(err: BaseException) -> str:
    """``Type: first line of the message`` of ``err`` (of the error a
    ``BackendCompilerFailed`` wraps)."""
    cause = getattr(err, "inner_exception", None) or err
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0][:160]}" if lines else type(cause).__name__


def warn_once(holder: Any, text: str) -> None:
    """Add ``text`` to ``holder.warnings``; the first of a compile (``holder.warned``
    unset) is also its one WARNING line."""
    holder.warnings.append(text)
    if holder.warned:
        log.info("simaccel: %s", text)
        return
    holder.warned = True
    log.warning("simaccel: %s (details: simaccel.reports())", text)

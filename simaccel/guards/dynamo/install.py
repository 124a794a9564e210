"""Installing simaccel's guards into the guards of the frame Dynamo is compiling.

How a backend guard reaches Dynamo (torch 2.13.0): a ``torch._guards.Guard`` added to the
OutputGraph's guards set while the backend runs is turned into the frame's guard manager
tree by ``CheckFunctionManager`` after the backend returns, like Dynamo's own guards. Its
create function (:func:`SIMACCEL_GUARD`) asks the GuardBuilder for the manager of its source
and hangs a C++ LAMBDA_GUARD leaf on it; the code part is what Dynamo's printout shows.
A frame-level guard (no source) instead joins the frame's folded check
(:func:`SIMACCEL_SHAPE_ENV`). A check that raises at call time is treated by the C++ leaf as
a failed guard: Dynamo logs the exception text as the recompile reason and recompiles.

One Python check per frame: Dynamo evaluates all shape-env guards of a frame in one Python
lambda (an "epilogue" LAMBDA_GUARD on the root, run after every other guard passed). For a
lifted frame those are ``not math.isnan(L['a'])`` per lifted float and simaccel's int-slot
range per lifted int; simaccel's frame-level guards (the device config) were one more root
lambda each. Each lambda is a C++ -> Python call per frame call, which made guard
evaluation with lifting slower than with lift="off" (whose EQUALS_MATCH guards are C++
only). So simaccel swaps the frame's SHAPE_ENV guard for SIMACCEL_SHAPE_ENV: it runs
Dynamo's own SHAPE_ENV create function, takes the Python code it would have installed, and
installs one function (:mod:`simaccel.guards.folded`) that runs simaccel's frame-level checks
and those same shape-env checks. Nothing is dropped: the same checks run, in one call.

Dynamo's NaN guard stays even for a float that only feeds tensor arithmetic: the shape env
decides comparisons such as ``a == a``, ``a != a`` or ``a - a == 0.0`` at trace time as if
``a`` were a real number, leaving no guard and no graph node behind (the graph of
``x * a if a == a else -x`` is the graph of ``x * a``). Only the NaN guard makes those
decisions valid, and the traced graph cannot prove none was made
(tests/guards/test_folded_guards.py shows such a frame).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from simaccel.guards.dynamo.frame import frame_slot, output_graph
from simaccel.guards.folded import FoldedPart, build_folded_check

log = logging.getLogger("simaccel")


def install_lambda_guard(source: Any, guard_fn: Callable[[Any], object], code_part: str) -> None:
    """Add ``guard_fn(value)`` to the frame's guards as a LAMBDA_GUARD on ``source``'s
    manager, shown as ``code_part``. A frame-level check (``source`` is the frame) joins
    the frame's folded check instead (see :func:`SIMACCEL_SHAPE_ENV`)."""
    from torch._dynamo.source import GlobalStateSource
    from torch._guards import Guard as DynamoGuard
    if isinstance(source, GlobalStateSource) and _fold_frame_check(guard_fn, code_part):
        return
    create = functools.partial(SIMACCEL_GUARD, guard_fn=guard_fn, code_part=code_part)
    output_graph().guards.add(DynamoGuard(source, create), collect_debug_stack=False)


def SIMACCEL_GUARD(builder: Any, guard: Any, *, guard_fn: Callable[[Any], object],  # noqa: N802
                   code_part: str) -> None:
    """Create function of a simaccel guard (named like Dynamo's own guard kinds)."""
    from torch._dynamo.guards import get_verbose_code_parts
    from torch._dynamo.source import GlobalStateSource
    parts = get_verbose_code_parts(code_part, guard)
    if isinstance(guard.originating_source, GlobalStateSource):
        builder.guard_manager.root.add_lambda_guard(guard_fn, parts, None)
    else:
        builder.get_guard_manager(guard).add_lambda_guard(guard_fn, parts, None)


def guard_symint_range(value: Any, low: int, high_exclusive: int, name: str) -> bool | None:
    """Record ``low <= value < high_exclusive`` for a SymInt as a shape-env guard of the
    frame being compiled (evaluated with Dynamo's other shape-env guards, inside the
    frame's folded check when simaccel's device guards are installed: ~35 ns per call,
    no Python call of its own). Returns the result at compile time, or None if ``value`` is
    not a backed SymInt.

    Dynamo prints where a shape-env guard came from after its text (``# (file:line in
    function)``), in its guard printout and in recompile reasons; here that would be this
    line, so the guard's ``name`` is recorded as its origin instead.
    """
    node = getattr(value, "node", None)
    if not isinstance(value, torch.SymInt) or node is None or node.hint is None:
        return None
    from torch.fx.experimental.symbolic_shapes import guard_bool
    before = _ShapeEnvOrigins(node.shape_env, node.expr.free_symbols)
    # One boolean expression, so the guard is "fits" or "does not fit", not two ranges.
    fits = guard_bool((value >= low) & (value < high_exclusive))
    before.name_new_origins(name)
    return fits


class _ShapeEnvOrigins:
    """The shape env's guard list length and the origins (``SLoc``) of the value-range
    bounds of some symbols, so that what a guard call adds can be told apart after it."""

    def __init__(self, shape_env: Any, symbols: Any) -> None:
        self.shape_env = shape_env
        self.guards = len(shape_env.guards)
        # The bounds' SLoc objects, not their holder: the shape env updates it in place.
        self.bounds = {s: _bound_origins(shape_env, s) for s in symbols}

    def name_new_origins(self, name: str) -> None:
        """Make ``name`` the origin of every guard and bound added since construction."""
        from torch._guards import SLoc
        from torch.fx.experimental.symbolic_shapes import ValueRangesSLoc
        env = self.shape_env
        origin = SLoc(framework_loc=name, maybe_user_loc=None)
        for index in range(self.guards, len(env.guards)):
            env.guards[index] = env.guards[index]._replace(sloc=origin)
        for symbol, (old_lower, old_upper) in self.bounds.items():
            lower, upper = _bound_origins(env, symbol)
            if lower is old_lower and upper is old_upper:
                continue
            # A new holder: one can be shared between symbols (replacements).
            env.var_to_range_sloc[symbol] = ValueRangesSLoc(
                lower if lower is old_lower else origin, upper if upper is old_upper else origin)


def _bound_origins(shape_env: Any, symbol: Any) -> tuple[Any, Any]:
    """The origins (``SLoc``) of ``symbol``'s lower and upper bound, (None, None) if none."""
    held = shape_env.var_to_range_sloc.get(symbol)
    return (None, None) if held is None else (held.lower, held.upper)


# ---------------------------------------------------------------- one Python check per frame

@dataclasses.dataclass
class FoldedFrameChecks:
    """simaccel's frame-level checks of one trace of a frame, as parts of the folded check.

    ``closure``: the objects the parts' expressions name. ``folding``: None until the first
    check asks; then whether the frame's SHAPE_ENV guard could be swapped (False: each
    check is installed as a root lambda of its own instead). One per trace
    (:func:`~simaccel.guards.dynamo.frame.frame_slot`).
    """

    parts: list[FoldedPart] = dataclasses.field(default_factory=list)
    closure: dict[str, object] = dataclasses.field(default_factory=dict)
    folding: bool | None = None


def install_frame_expression(template: str, objects: Mapping[str, object],
                             code_part: str) -> None:
    """Add a frame-level guard written as a Python expression, shown as ``code_part``.

    ``template`` is an expression over ``L`` (the frame's locals), ``G`` (its globals) and
    ``{name}`` placeholders for the entries of ``objects`` (no other braces), e.g.
    ``"{device}.config is {config}"``; it must be true now and must not raise. It runs
    inline in the frame's folded check (no Python call of its own: ~20 ns instead of the
    ~100 ns of a lambda guard calling a function).
    """
    if _fold_frame_expression(template, objects, code_part):
        return
    from torch._dynamo.source import GlobalStateSource
    names = {key: f"___simaccel_{key}" for key in objects}
    part = FoldedPart(template.format(**names), code_part)
    check = build_folded_check([part], {names[k]: v for k, v in objects.items()},
                               {"G": output_graph().global_scope})
    install_lambda_guard(GlobalStateSource(), check, code_part)


def _fold_frame_check(guard_fn: Callable[[Any], object], code_part: str) -> bool:
    """Queue ``guard_fn(frame_locals)`` for the frame's folded check; False if it cannot."""
    return _fold_frame_expression("{check}(L)", {"check": guard_fn}, code_part)


def _fold_frame_expression(template: str, objects: Mapping[str, object], text: str) -> bool:
    frame = frame_slot(FoldedFrameChecks)
    if frame.folding is None:
        frame.folding = _swap_shape_env_guard(frame)
    if frame.folding:
        names = {key: f"___simaccel_frame{len(frame.parts)}_{key}" for key in objects}
        frame.closure.update({names[key]: value for key, value in objects.items()})
        frame.parts.append(FoldedPart(template.format(**names), text))
    return frame.folding


def _swap_shape_env_guard(frame: FoldedFrameChecks) -> bool:
    """Replace the frame's SHAPE_ENV guard by SIMACCEL_SHAPE_ENV bound to ``frame``."""
    from torch._dynamo.guards import GuardBuilder
    from torch._guards import Guard as DynamoGuard
    guards = output_graph().guards
    found = [g for g in guards if g.create_fn is GuardBuilder.SHAPE_ENV]
    if len(found) != 1:
        log.debug("simaccel: %d SHAPE_ENV guards; frame checks stay separate", len(found))
        return False
    shape_guard = found[0]
    source = shape_guard.originating_source
    guards.inner.discard(shape_guard)
    by_source = guards.source_to_guards.get(source, [])
    if shape_guard in by_source:
        by_source.remove(shape_guard)
    create = functools.partial(SIMACCEL_SHAPE_ENV, frame=frame)
    guards.add(DynamoGuard(source, create), collect_debug_stack=False)
    return True


def SIMACCEL_SHAPE_ENV(builder: Any, guard: Any, *,  # noqa: N802
                       frame: FoldedFrameChecks) -> None:
    """Create function replacing Dynamo's SHAPE_ENV: Dynamo's shape-env checks and the
    frame's simaccel checks as one epilogue LAMBDA_GUARD (one Python call per frame call).

    With ``torch._dynamo.config.enable_cpp_symbolic_shape_guards`` Dynamo installs its
    shape guards in C++ itself and only simaccel's checks end up in the Python function.
    """
    from torch._dynamo.guards import GuardBuilder, _get_closure_vars
    captured: list[tuple[list[str], list[str], dict[str, object]]] = []

    def capture(code_parts: list[str], verbose_code_parts: list[str],
                closure_vars: dict[str, object] | None = None, is_epilogue: bool = True) -> None:
        captured.append((list(code_parts), list(verbose_code_parts),
                         dict(closure_vars if closure_vars is not None else _get_closure_vars())))

    builder.add_python_lambda_leaf_guard_to_root = capture
    try:
        GuardBuilder.SHAPE_ENV(builder, guard)
    finally:
        del builder.add_python_lambda_leaf_guard_to_root
    parts, closure = _folded_parts(frame, captured)
    if parts:
        check = build_folded_check(parts, closure, {"G": builder.scope["G"]}, _cse(parts))
        builder.guard_manager.root.add_epilogue_lambda_guard(
            check, [part.text for part in parts], None)


def _folded_parts(frame: FoldedFrameChecks,
                  captured: Sequence[tuple[list[str], list[str], dict[str, object]]]
                  ) -> tuple[list[FoldedPart], dict[str, object]]:
    """simaccel's frame checks first (as in the old root lambdas), then the shape env's."""
    parts, closure = list(frame.parts), {}
    for code_parts, verbose_parts, closure_vars in captured:
        closure.update(closure_vars)
        texts = verbose_parts if len(verbose_parts) == len(code_parts) else code_parts
        parts.extend(FoldedPart(code, text) for code, text in zip(code_parts, texts))
    closure.update(frame.closure)
    return parts, closure


def _cse(parts: Sequence[FoldedPart]) -> Callable[[str], tuple[list[str], str]]:
    """Dynamo's common-subexpression pass over the parts (as for its own guard code)."""
    from torch._dynamo.guards import PyExprCSEPass
    cse = PyExprCSEPass()
    cse.count([part.expr for part in parts])
    return cse.replace

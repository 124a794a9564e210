"""Asking Dynamo to re-trace the frame with baked scalars as graph inputs.

How a re-trace turns a baked scalar into a graph input (torch 2.13.0):

* ``int``: ``VariableBuilder.wrap_literal`` checks ``torch.compiler.config.dynamic_sources``
  *before* any specialization rule (``dynamic=False``, globals, nn.Module int attributes), so
  listing the exact source name there makes it a ``SymInt`` graph input.
* ``float``: ``VariableBuilder.wrap_symfloat`` tensorifies a float whose frame-state entry
  (``pgo.FrameStateSizeEntry.scalar``) is ``auto_dynamic``; that entry is only honoured while
  ``config.automatic_dynamic_shapes`` is on (``dynamic=False`` turns it off), so the re-trace
  runs with it on. Tensor entries of the frame state already hold this call's sizes, so
  tensor shapes stay static.
* The restart itself is ``TensorifyScalarRestartAnalysis``: the one exception Dynamo lets a
  backend raise to have the frame re-traced inside the same compile (no recompile).

The config changes are undone when Dynamo's compile of the frame ends (an end callback of
``torch._dynamo.callback_handler``); frame-state entries stay, which is how Dynamo itself
remembers that a scalar is dynamic.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import torch

from simaccel.guards.dynamo.failures import install_failure_hook
from simaccel.guards.dynamo.frame import call_at_compile_end, current_compile_id, output_graph
from simaccel.guards.records import RetraceRequest, ScalarSite
from simaccel.guards.sources import exact_source_regex


class RetracesPerCompile:
    """The re-trace request of each frame compile under way, by Dynamo's compile id
    (``"0/1"``).

    Lifetime: one compile of a frame. A request is made on the frame's first trace, read
    when the re-traced frame reaches the backend again (same compile id), replaced if a
    second round is asked, and dropped, its config changes undone, when Dynamo's compile
    ends (:func:`_on_compile_end`).
    """

    def __init__(self) -> None:
        self._by_compile: dict[str, RetraceRequest] = {}

    def get(self, compile_id: str) -> RetraceRequest | None:
        return self._by_compile.get(compile_id)

    def put(self, request: RetraceRequest) -> RetraceRequest | None:
        """Make ``request`` its compile's request; returns the one it replaces, if any."""
        previous = self._by_compile.pop(request.compile_id, None)
        self._by_compile[request.compile_id] = request
        return previous

    def pop(self, compile_id: str) -> RetraceRequest | None:
        return self._by_compile.pop(compile_id, None)

    def drain(self) -> list[RetraceRequest]:
        """Remove and return every request, newest first: undoing their config changes in
        that order restores the values from before the oldest (nested compiles)."""
        requests = list(reversed(self._by_compile.values()))
        self._by_compile.clear()
        return requests

    def __len__(self) -> int:
        return len(self._by_compile)


retraces_per_compile = RetracesPerCompile()


def pending_retrace() -> RetraceRequest | None:
    """The request made earlier in this same compile, i.e. ``gm`` is a re-traced graph."""
    return retraces_per_compile.get(current_compile_id())


def request_retrace(sites: Sequence[ScalarSite], before: Mapping[str, tuple[str, ...]],
                    demoted: Mapping[str, str] | None = None, first_break: Any = None,
                    on_failure: Callable[..., None] | None = None,
                    warnings: Sequence[str] = ()) -> NoReturn:
    """Make Dynamo re-trace the frame with ``sites`` as graph inputs; never returns.

    Called again in one compile (after ``inspect_lifted`` found sources that must stay
    specialized, or after a failed re-trace), it replaces the earlier request, keeps its
    ``first_break``, ``on_failure`` and warnings, and counts one more round. ``warnings``
    are what the compile reported before its first request (already logged).
    """
    compile_id = current_compile_id()
    previous = retraces_per_compile.pop(compile_id)
    if previous is not None:
        _run_undo(previous.undo_config)
        _run_undo(previous.undo_frame_state)
    request = RetraceRequest(compile_id, {s.source: s for s in sites}, dict(before),
                             dict(demoted or {}), previous.rounds + 1 if previous else 1)
    if previous is not None:
        request.first_break, request.on_failure = previous.first_break, previous.on_failure
        request.warnings, request.warned = previous.warnings, previous.warned
    else:
        request.warnings, request.warned = list(warnings), bool(warnings)
    request.first_break = first_break if first_break is not None else request.first_break
    request.on_failure = on_failure or request.on_failure
    _apply_request(request)
    install_failure_hook(pending_retrace)
    retraces_per_compile.put(request)
    call_at_compile_end(_on_compile_end)
    restart_trace(f"simaccel: re-trace to lift scalars {', '.join(request.sites)}")


def restart_trace(reason: str) -> NoReturn:
    """Make Dynamo trace the frame again, in the same compile; never returns."""
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis
    from torch._dynamo.symbolic_convert import InstructionTranslator
    # Dynamo replays its speculation log on a restart; the next trace takes other paths
    # (symbolic compares instead of constants, or the reverse), so the old log would
    # diverge.
    InstructionTranslator.current_tx().speculation_log.clear()
    raise TensorifyScalarRestartAnalysis(restart_reason=reason)


def _run_undo(actions: list[Callable[[], None]]) -> None:
    while actions:
        actions.pop()()


def _apply_request(request: RetraceRequest) -> None:
    ints = [n for n, s in request.sites.items() if s.kind == "int"]
    floats = [n for n, s in request.sites.items() if s.kind == "float"]
    if ints:
        extra = ",".join(exact_source_regex(n) for n in ints)
        _patch(torch.compiler.config, "dynamic_sources",
               lambda old: f"{old},{extra}" if old else extra, request.undo_config)
    if floats:
        _patch(torch._dynamo.config, "automatic_dynamic_shapes", lambda _: True,
               request.undo_config)
        _patch(torch._dynamo.config, "specialize_float", lambda _: False, request.undo_config)
        _seed_frame_state(floats, request.undo_frame_state)


def _patch(obj: Any, name: str, new: Callable[[Any], Any],
           undo: list[Callable[[], None]]) -> None:
    old = getattr(obj, name)
    setattr(obj, name, new(old))
    undo.append(lambda: setattr(obj, name, old))


def _seed_frame_state(names: Sequence[str], undo: list[Callable[[], None]]) -> None:
    """Mark ``names`` auto-dynamic in the frame state of every code object traced."""
    from torch._dynamo import pgo
    out = output_graph()
    traced = {(c.co_filename, c.co_firstlineno, c.co_name)
              for c in out.tracing_context.traced_code}
    for code_id, state in list(pgo.get_code_state().items()):
        if (code_id.filename, code_id.firstlineno, code_id.name) not in traced:
            continue
        for name in names:
            if name not in state.automatic_dynamic:
                continue
            old = state.automatic_dynamic[name]
            state.automatic_dynamic[name] = pgo.FrameStateSizeEntry(scalar=pgo.auto_dynamic)
            undo.append(lambda d=state.automatic_dynamic, n=name, o=old: d.__setitem__(n, o))


def _on_compile_end(_args: Any) -> None:
    """Dynamo finished compiling (outermost compile): undo every config change made."""
    for request in retraces_per_compile.drain():
        _run_undo(request.undo_config)

"""A lifting re-trace that fails is traced again with its scalars specialized.

Lifting changes what Dynamo traces: a SymInt that slices a Python list
(``self.layers[:n]``) raises inside Dynamo, a lifted value can make a lowering fail. Such
an error happens only because simaccel asked for the re-trace, so it must not reach the
user: the frame compiles as ``lift="off"`` would, at the cost of one more trace.

The hook wraps ``InstructionTranslator.run`` (the root frame's tracer; the backend is
called from inside it, so a backend error passes through it as ``BackendCompilerFailed``
or a simaccel error). When a trace of a compile that has a pending re-trace request
fails, the request's ``on_failure`` decides (:mod:`simaccel.guards.lift`): it raises
Dynamo's restart with some sources specialized, or returns and the error goes on. A
first trace that fails with floats lifted on it (:mod:`.first_trace`) goes to the
first-trace handler (:mod:`simaccel.guards.first_trace`) the same way. Otherwise
(``lift="off"``, another backend, nothing lifted) the hook does nothing.

The sources an error involves are found in the traceback: the innermost frames' locals
holding a symbolic value (a SymInt, a Dynamo ``SymNodeVariable``, a slice of them) whose
symbol belongs to a requested source.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

import torch

from simaccel.guards.dynamo.frame import output_graph

#: frames of a traceback searched for symbolic locals, innermost first
_FRAMES_SEARCHED = 40
_HOOK_MARK = "_simaccel_retrace_hook"
#: the pending request of the compile under way (set by :func:`install_failure_hook`)
_PENDING: list[Callable[[], Any]] = []
#: first_trace(tracer, error): a trace failed with no re-trace request pending
_FIRST_TRACE: list[Callable[[Any, BaseException], None]] = []


def install_failure_hook(pending: Callable[[], Any] | None = None,
                         first_trace: Callable[[Any, BaseException], None] | None = None
                         ) -> None:
    """Wrap ``InstructionTranslator.run`` once per process (idempotent); ``pending()``
    gives the re-trace request of the compile under way, or None; ``first_trace(tracer,
    error)`` is told of a failed trace with no request pending (:mod:`.first_trace`)."""
    from torch._dynamo.symbolic_convert import InstructionTranslator
    if pending is not None:
        _PENDING[:] = [pending]
    if first_trace is not None:
        _FIRST_TRACE[:] = [first_trace]
    original = InstructionTranslator.run
    if getattr(original, _HOOK_MARK, False):
        return

    def run(self: Any) -> None:
        from torch._dynamo.exc import RestartAnalysis, SkipFrame
        try:
            return original(self)
        except (RestartAnalysis, SkipFrame):
            raise
        except Exception as err:
            _on_failure(self, err)
            raise

    setattr(run, _HOOK_MARK, True)
    run.__wrapped__ = original  # type: ignore[attr-defined]
    InstructionTranslator.run = run


def _on_failure(tracer: Any, err: BaseException) -> None:
    """Hand a failed trace to its compile's request (which may raise the restart)."""
    request = _PENDING[0]() if _PENDING else None
    if request is not None:
        if request.on_failure is not None and request.sites:
            suspects = involved_sources(err, tracer.output.shape_env, request.sites)
            request.on_failure(request, err, suspects)
        return
    if _FIRST_TRACE:
        _FIRST_TRACE[0](tracer, err)


def involved_sources(err: BaseException, shape_env: Any, wanted: Iterable[str]
                     ) -> tuple[str, ...]:
    """The sources among ``wanted`` whose symbols the innermost frames of ``err``'s
    traceback (and of its causes) hold; ``()`` if none is found."""
    wanted = set(wanted)
    names: dict[Any, set[str]] = {}
    for symbol, sources in shape_env.var_to_sources.items():
        names[symbol] = {s.name for s in sources} & wanted
    for frame_locals in _innermost_locals(err):
        found = set()
        for value in frame_locals.values():
            for symbol in _symbols(value, depth=2):
                found |= names.get(symbol, set())
        if found:
            return tuple(sorted(found))
    return ()


def _innermost_locals(err: BaseException) -> Iterator[dict[str, Any]]:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        frames = list(_frames(err.__traceback__))
        for frame in reversed(frames[-_FRAMES_SEARCHED:]):
            yield frame.f_locals
        err = (getattr(err, "inner_exception", None) or err.__cause__ or err.__context__)


def _frames(tb: TracebackType | None) -> Iterator[Any]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _symbols(value: Any, depth: int) -> Iterator[Any]:
    """Free symbols of a symbolic value, of a slice or short sequence of them, or of a
    Dynamo variable wrapping one (``sym_num``)."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        yield from value.node.expr.free_symbols
        return
    if depth == 0:
        return
    if isinstance(value, slice):
        items: Iterable[Any] = (value.start, value.stop, value.step)
    elif isinstance(value, (list, tuple)) and len(value) <= 8:
        items = value
    else:
        from torch._dynamo.variables import SymNodeVariable
        items = (value.sym_num,) if isinstance(value, SymNodeVariable) else ()
    for item in items:
        yield from _symbols(item, depth - 1)


def graph_end() -> tuple[bool, tuple[tuple[str, int], ...]]:
    """Where the graph of the trace under way ends: (ended at a graph break, the user
    stack of that point as (file, line) pairs). A re-trace must end where the first trace
    did, or lifting moved a graph break."""
    reason = getattr(output_graph(), "compile_subgraph_reason", None)
    if reason is None:
        return False, ()
    stack = tuple((f.filename, f.lineno or 0) for f in reason.user_stack)
    return bool(reason.graph_break), stack

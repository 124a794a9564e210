"""The frame Dynamo is compiling: its sources, their values, its graph inputs.

Everything here runs *inside* a backend's CompilerFn, while Dynamo compiles a frame: the
frame is found through ``InstructionTranslator.current_tx()`` and its ``OutputGraph``
(Dynamo's state of one trace). Sources are Dynamo ``Source`` objects; their names are the
text Dynamo prints (``L['x']``, ``G['CFG']['k']``, ``L['self'].scale``).
"""
from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from simaccel.errors import SimAccelError
from simaccel.guards.records import GraphInput, ScalarSite, value_kind
from simaccel.guards.sources import parse_source

log = logging.getLogger("simaccel")

#: Dynamo's guard kinds that pin a Python value
VALUE_GUARDS = ("CONSTANT_MATCH", "EQUALS_MATCH")


def output_graph() -> Any:
    """The OutputGraph of the frame Dynamo is compiling now (raises if none)."""
    from torch._dynamo.symbolic_convert import InstructionTranslator
    try:
        tx = InstructionTranslator.current_tx()
    except AttributeError:  # the thread-local is unset until Dynamo first traces
        tx = None
    if tx is None:
        raise SimAccelError("simaccel.guards must be called from a backend while Dynamo "
                            "compiles a frame (no frame is being traced)")
    return tx.output


def current_code() -> Any:
    """The code object and closure of the frame being compiled (the root of the compile)."""
    from torch._dynamo.symbolic_convert import InstructionTranslator
    output_graph()  # raises a clear error outside a compile
    tx = InstructionTranslator.current_tx()
    return tx.f_code, tx.closure


def current_compile_id() -> str:
    """Dynamo's id of the frame compile under way, e.g. ``"0/1"`` (frame 0, 2nd compile)."""
    from torch._guards import CompileContext
    return str(CompileContext.current_compile_id())


def call_at_compile_end(callback: Callable[[Any], None]) -> None:
    """Have Dynamo call ``callback`` when its (outermost) compile of a frame ends.
    Registered again whenever it is missing: ``torch._dynamo.reset()`` clears every
    callback."""
    from torch._dynamo.callback import callback_handler
    if callback not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(callback)


def in_resume_frame() -> bool:
    """Whether the frame being compiled is Dynamo's continuation after a graph break."""
    from torch._dynamo.resume_execution import TORCH_DYNAMO_RESUME_IN_PREFIX
    code, _ = current_code()
    return code.co_name.startswith(TORCH_DYNAMO_RESUME_IN_PREFIX)


# ---------------------------------------------------------------- values behind sources

def source_value(out: Any, source: Any) -> Any:
    """The value behind ``source`` in the frame of OutputGraph ``out`` (raises if none)."""
    from torch._dynamo.guards import _get_closure_vars
    scope = {"L": out.local_scope, "G": out.global_scope}
    return source.get_value(scope, dict(_get_closure_vars()), {})


def frame_value(source: Any) -> Any:
    """The value behind ``source`` in the frame being compiled (the frame's locals for the
    frame-level source)."""
    from torch._dynamo.source import GlobalStateSource
    out = output_graph()
    if isinstance(source, GlobalStateSource):
        return out.local_scope
    return source_value(out, source)


def eval_frame_expression(expr: str) -> Any:
    """``expr``, Python over ``L`` (the frame's locals) and ``G`` (its globals), evaluated
    on the frame being compiled, as a folded guard check evaluates it on a call."""
    out = output_graph()
    return eval(expr, {"L": out.local_scope, "G": out.global_scope})  # noqa: S307


def where(out: Any, source: Any) -> str:
    """Human description of where the value behind ``source`` lives."""
    from torch._dynamo import source as S
    if isinstance(source, S.LocalSource):
        return "closure cell" if source.is_derefed_cell_contents else "argument"
    if isinstance(source, S.GlobalSource):
        return "global"
    if isinstance(source, S.DefaultsSource):
        return "default argument"
    if isinstance(source, S.AttrSource):
        if source.member == "cell_contents":
            return "closure cell"
        gs = source.guard_source
        if (gs.is_specialized_nn_module() or gs.is_unspecialized_nn_module()
                or gs.is_unspecialized_builtin_nn_module()):
            return "nn.Module attribute"
        return "object attribute"
    if isinstance(source, (S.DictGetItemSource, S.GetItemSource)):
        try:
            container = source_value(out, source.base)
        except Exception:  # noqa: BLE001 - description only
            return "item"
        return f"{type(container).__name__} item"
    return type(source).__name__


def attribute_owner(out: Any, source: Any) -> tuple[type | None, str]:
    """(class of the object holding the attribute ``source`` reads, attribute name), or
    (None, "") when ``source`` is not an attribute read."""
    from torch._dynamo import source as S
    if not isinstance(source, S.AttrSource):
        return None, ""
    try:
        return type(source_value(out, source.base)), source.member
    except Exception:  # noqa: BLE001 - description only: the site is still reported
        return None, ""


#: (the OutputGraph, its guard count, its sites) of the last :func:`value_guard_sites`
_LAST_SITES: list[Any] = [None, -1, []]


def value_guard_sites() -> list[ScalarSite]:
    """Every value guard (CONSTANT_MATCH / EQUALS_MATCH) of the frame, one site per source.
    Worked out once per set of guards: lifting and its report both ask (~10 ms a time on
    a model with 60 value guards, each value read through Dynamo's source)."""
    out = output_graph()
    last_out, count, sites_before = _LAST_SITES
    if last_out is not None and last_out() is out and count == len(out.guards):
        return list(sites_before)
    found = _value_guard_sites(out)
    _LAST_SITES[:] = [weakref.ref(out), len(out.guards), found]
    return list(found)


def _value_guard_sites(out: Any) -> list[ScalarSite]:
    sites: dict[str, ScalarSite] = {}
    for guard in sorted(out.guards, key=lambda g: g.name):
        kind_name = guard.create_fn_name()
        if kind_name not in VALUE_GUARDS or guard.name in sites:
            continue
        source = guard.originating_source
        try:
            value = source_value(out, source)
        except Exception as err:  # noqa: BLE001 - an odd source is reported, not fatal
            log.debug("simaccel: cannot read %s: %s", guard.name, err)
            continue
        sites[guard.name] = ScalarSite(
            guard.name, value, value_kind(value), where(out, source),
            f"{kind_name}: {guard.name} == {value!r}", *attribute_owner(out, source))
    return list(sites.values())


# ---------------------------------------------------------------- source names -> sources

def resolve_source(text: str | None) -> Any:
    """The Dynamo ``Source`` named by ``text`` (``L['x']``, ``G['CFG']['k']``, ``L['m'].a``).

    ``None`` is the frame itself (the root of the guard tree). A graph input's own source
    object is reused when its name matches. Raises ``ValueError`` for text that is not a
    chain of ``L[...]``/``G[...]``, ``.attr`` and ``[constant]``, ``LookupError`` when the
    frame has no such value.
    """
    from torch._dynamo import source as S
    out = output_graph()
    if text is None:
        return S.GlobalStateSource()
    (scope, name), steps = parse_source(text)
    source = S.LocalSource(name) if scope == "L" else S.GlobalSource(name)
    for step, key in steps:
        if step == "attr":
            source = S.AttrSource(source, key)
            continue
        try:
            container = source_value(out, source)
        except Exception:  # noqa: BLE001 - reported below, on the full source
            container = None
        source = (S.DictGetItemSource if isinstance(container, dict) else S.GetItemSource)(
            source, key)
    known = _graph_arg_sources(out).get(source.name)
    if known is not None and not known.guard_source.is_specialized_nn_module():
        source = known
    try:
        source_value(out, source)
    except Exception as err:  # noqa: BLE001 - any failure to read means "no such value"
        raise LookupError(f"the frame has no value {source.name} "
                          f"({type(err).__name__}: {err})") from err
    return source


def _graph_arg_sources(out: Any) -> dict[str, Any]:
    """Name -> source object of every graph input of the frame and of their bases."""
    found: dict[str, Any] = {}
    for grapharg in out.graphargs:
        source = grapharg.source
        while source is not None:
            found.setdefault(source.name, source)
            source = getattr(source, "base", None)
    return found


# ---------------------------------------------------------------- graph inputs

def placeholders_by_source(gm: torch.fx.GraphModule) -> dict[str, tuple[int, torch.fx.Node]]:
    """Source name -> (input index, placeholder node) for the graph's Dynamo inputs."""
    found = {}
    for index, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        grapharg = node.meta.get("grapharg")
        if grapharg is not None and grapharg.source is not None:
            found[grapharg.source.name] = (index, node)
    return found


def graph_inputs(gm: torch.fx.GraphModule) -> list[GraphInput]:
    """Every placeholder of ``gm`` with its source and current frame value."""
    out = output_graph()
    found = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for index, node in enumerate(placeholders):
        source = getattr(node.meta.get("grapharg"), "source", None)
        example = node.meta.get("example_value")
        if source is None:
            found.append(GraphInput(index, None, example))
            continue
        prop = _tensor_property(source)
        try:
            value = _input_value(out, source, prop)
        except Exception:  # noqa: BLE001 - callers treat the example conservatively
            value = example
        found.append(GraphInput(index, source.name, value, prop))
    return found


def _tensor_property(source: Any) -> tuple[str, str, int | None] | None:
    """``(base source, "size"|"stride"|"storage_offset", dim)`` for a tensor-property
    source (``L['x'].size()[0]``), else None."""
    from torch._dynamo.source import TensorPropertySource
    if not isinstance(source, TensorPropertySource):
        return None
    return source.base.name, source.prop.method_name(), source.idx


def _input_value(out: Any, source: Any, prop: tuple[str, str, int | None] | None) -> Any:
    """The frame's value behind a graph input's source (``prop``: its tensor property)."""
    if prop is None:
        return source_value(out, source)
    _, method, dim = prop
    base = source_value(out, source.base)
    return getattr(base, method)(*(() if dim is None else (dim,)))


# ---------------------------------------------------------------- per-trace objects

class SlotsPerTrace:
    """Objects that live exactly as long as one trace of a frame (one ``OutputGraph``).

    A restart of the trace (simaccel's lifting re-trace, Dynamo's own restarts) makes a
    fresh OutputGraph, hence fresh slots: whatever was recorded for an abandoned trace
    (guards to install, folded checks) goes with it. OutputGraph is not hashable, so
    entries are keyed by ``id()`` and a weak reference's callback drops an entry when its
    OutputGraph is collected.
    """

    def __init__(self) -> None:
        self._by_trace: dict[int, tuple[weakref.ref[Any], dict[Any, Any]]] = {}

    def slot(self, out: Any, factory: Callable[[], Any]) -> Any:
        """The object ``factory`` made for trace ``out`` (made now on first use)."""
        key = id(out)
        ref, slots = self._by_trace.get(key, (None, {}))
        if ref is None or ref() is not out:
            slots = {}
            self._by_trace[key] = (weakref.ref(out, lambda _: self._by_trace.pop(key, None)),
                                   slots)
        if factory not in slots:
            slots[factory] = factory()
        return slots[factory]

    def __len__(self) -> int:
        """Traces that still have slots (their OutputGraph is alive)."""
        return len(self._by_trace)


slots_per_trace = SlotsPerTrace()


def frame_slot(factory: Callable[[], Any]) -> Any:
    """A per-trace object of the frame being compiled (one per OutputGraph, made by
    ``factory`` on first use; see :class:`SlotsPerTrace`)."""
    return slots_per_trace.slot(output_graph(), factory)

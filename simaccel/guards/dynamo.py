"""The one simaccel module that reaches into ``torch._dynamo`` / ``torch._guards`` internals.

Everything here runs *inside* a backend's CompilerFn, while Dynamo compiles a frame: the
frame being compiled is found through ``InstructionTranslator.current_tx()``.

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

import dataclasses
import functools
import importlib
import logging
import types
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

import torch
import torch.fx
from torch.utils import _pytree as pytree

from simaccel.errors import SimAccelError
from simaccel.guards import lift_memory
from simaccel.guards.folded import FoldedPart, build_folded_check
from simaccel.guards.records import (
    GraphInput, LiftOutcome, RetraceRequest, ScalarSite, value_kind,
)
from simaccel.guards.sources import exact_source_regex as _exact_source_regex
from simaccel.guards.sources import parse_source

log = logging.getLogger("simaccel")

SUPPORTED_TORCH_VERSION = "2.13.0"
VALUE_GUARDS = ("CONSTANT_MATCH", "EQUALS_MATCH")

# (module, attribute path) pairs this module relies on; checked by assert_supported_torch.
_REQUIRED_ATTRS: tuple[tuple[str, str], ...] = (
    ("torch._dynamo.symbolic_convert", "InstructionTranslator.current_tx"),
    ("torch._dynamo.exc", "TensorifyScalarRestartAnalysis"),
    ("torch._dynamo.callback", "callback_handler.register_end_callback"),
    ("torch._dynamo.callback", "callback_handler.end_callbacks"),
    ("torch._dynamo.pgo", "get_code_state"),
    ("torch._dynamo.pgo", "CodeId.make"),
    ("torch._dynamo.pgo", "FrameStateSizeEntry"),
    ("torch._dynamo.pgo", "auto_dynamic"),
    ("torch._dynamo.guards", "_get_closure_vars"),
    ("torch._dynamo.source", "LocalSource"),
    ("torch._dynamo.source", "GlobalSource"),
    ("torch._dynamo.source", "AttrSource"),
    ("torch._dynamo.source", "DictGetItemSource"),
    ("torch._dynamo.source", "GetItemSource"),
    ("torch._dynamo.source", "DefaultsSource"),
    ("torch._dynamo.variables.builder", "is_dynamic_source"),
    ("torch._dynamo.config", "automatic_dynamic_shapes"),
    ("torch._dynamo.config", "specialize_float"),
    ("torch._guards", "CompileContext.current_compile_id"),
    ("torch.compiler.config", "dynamic_sources"),
    ("torch._guards", "Guard"),
    ("torch._guards", "GuardsSet.add"),
    ("torch._dynamo.guards", "get_verbose_code_parts"),
    ("torch._dynamo.guards", "GuardBuilder.get_guard_manager"),
    ("torch._dynamo.source", "GlobalStateSource"),
    ("torch._dynamo.source", "TensorPropertySource"),
    ("torch._dynamo.resume_execution", "TORCH_DYNAMO_RESUME_IN_PREFIX"),
    ("torch._dynamo.guards", "GuardBuilder.SHAPE_ENV"),
    ("torch._dynamo.guards", "GuardBuilder.add_python_lambda_leaf_guard_to_root"),
    ("torch._dynamo.guards", "PyExprCSEPass"),
    ("torch._guards", "GuardsSet.track_guard_by_source"),
    ("torch.utils._sympy.symbol", "symbol_is_type"),
    ("torch.utils._sympy.symbol", "SymT.FLOAT"),
    ("torch._dynamo.utils", "GmWrapper"),
    ("torch._functorch._aot_autograd.schemas", "OutputType.non_alias"),
    ("torch._functorch._aot_autograd.schemas", "SubclassCreationMeta"),
    ("torch._functorch._aot_autograd.schemas", "ViewAndMutationMeta"),
    ("torch._guards", "TracingContext.try_get"),
)


#: the fields of AOTAutograd's graph metadata runtime_wrapper_needed reads
_AOT_META_FIELDS = {"input_info", "output_info", "num_intermediate_bases", "tokens",
                    "subclass_inp_meta"}


def assert_supported_torch() -> None:
    """Fail loudly if this torch is not the one whose internals this module was written for.

    Raises :class:`SimAccelError` naming the version or the missing attribute.
    """
    version = torch.__version__.split("+")[0]
    if version != SUPPORTED_TORCH_VERSION:
        raise SimAccelError(
            f"simaccel.guards.dynamo supports torch {SUPPORTED_TORCH_VERSION}, found "
            f"{torch.__version__}; Dynamo internals used for scalar lifting may have changed. "
            f"Use options={{'lift': 'off'}} or update simaccel/guards/dynamo.py.")
    for module_name, path in _REQUIRED_ATTRS:
        obj: Any = importlib.import_module(module_name)
        for part in path.split("."):
            if not hasattr(obj, part):
                raise SimAccelError(
                    f"torch internals changed: {module_name}.{path} is missing; "
                    f"simaccel.guards.dynamo must be updated (or use options={{'lift': 'off'}})")
            obj = getattr(obj, part)
    from torch._dynamo import pgo
    if "scalar" not in {f.name for f in dataclasses.fields(pgo.FrameStateSizeEntry)}:
        raise SimAccelError("torch internals changed: FrameStateSizeEntry has no 'scalar'")
    from torch._functorch._aot_autograd.schemas import ViewAndMutationMeta
    missing = _AOT_META_FIELDS - {f.name for f in dataclasses.fields(ViewAndMutationMeta)}
    if missing:
        raise SimAccelError(f"torch internals changed: ViewAndMutationMeta has no {missing}")
    from torch._dynamo.exc import RestartAnalysis, TensorifyScalarRestartAnalysis
    if not issubclass(TensorifyScalarRestartAnalysis, RestartAnalysis):
        raise SimAccelError("torch internals changed: TensorifyScalarRestartAnalysis is no "
                            "longer a RestartAnalysis")


# ---------------------------------------------------------------- the frame being compiled

def _output_graph() -> Any:
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


def current_compile_id() -> str:
    """Dynamo's id of the frame compile under way, e.g. ``"0/1"`` (frame 0, 2nd compile)."""
    from torch._guards import CompileContext
    return str(CompileContext.current_compile_id())


def value_guard_sites() -> list[ScalarSite]:
    """Every value guard (CONSTANT_MATCH / EQUALS_MATCH) of the frame, one site per source."""
    out = _output_graph()
    sites: dict[str, ScalarSite] = {}
    for guard in sorted(out.guards, key=lambda g: g.name):
        kind_name = guard.create_fn_name()
        if kind_name not in VALUE_GUARDS or guard.name in sites:
            continue
        source = guard.originating_source
        try:
            value = _source_value(out, source)
        except Exception as err:  # noqa: BLE001 - an odd source is reported, not fatal
            log.debug("simaccel: cannot read %s: %s", guard.name, err)
            continue
        sites[guard.name] = ScalarSite(
            guard.name, value, value_kind(value), _where(out, source),
            f"{kind_name}: {guard.name} == {value!r}", *_attribute_owner(out, source))
    return list(sites.values())


def _attribute_owner(out: Any, source: Any) -> tuple[type | None, str]:
    """(class of the object holding the attribute ``source`` reads, attribute name), or
    (None, "") when ``source`` is not an attribute read."""
    from torch._dynamo import source as S
    if not isinstance(source, S.AttrSource):
        return None, ""
    try:
        return type(_source_value(out, source.base)), source.member
    except Exception:  # noqa: BLE001 - description only: the site is still reported
        return None, ""


def _source_value(out: Any, source: Any) -> Any:
    from torch._dynamo.guards import _get_closure_vars
    scope = {"L": out.local_scope, "G": out.global_scope}
    return source.get_value(scope, dict(_get_closure_vars()), {})


def _where(out: Any, source: Any) -> str:
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
            container = _source_value(out, source.base)
        except Exception:  # noqa: BLE001 - description only
            return "item"
        return f"{type(container).__name__} item"
    return type(source).__name__


# ---------------------------------------------------------------- readable guards

def readable_guards(sources: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Guards of the frame on each source, readable (``TYPE_MATCH: type(L['a']) is float``).

    Shape-env predicates on a lifted scalar's symbol are included, written with source names
    (``L['alpha'] > 0.0``), the way ``TORCH_LOGS=guards`` prints them.
    """
    out = _output_graph()
    wanted = set(sources)
    result: dict[str, list[str]] = {name: [] for name in wanted}
    for guard in sorted(out.guards, key=lambda g: (g.name, g.create_fn_name())):
        if guard.name in wanted:
            result[guard.name].append(_guard_text(out, guard))
    for name, predicates in symbol_predicates(wanted).items():
        result[name].extend(predicates)
    for name in _float_symbol_sources(wanted):
        result[name].append(f"not math.isnan({name})")
    return {name: tuple(dict.fromkeys(lines)) for name, lines in result.items()}


def _float_symbol_sources(sources: Iterable[str]) -> list[str]:
    """Sources whose value is a float symbol of the shape env: Dynamo guards each one with
    ``not math.isnan(...)`` (``ShapeEnv.produce_guards``: the shape env reasons as if the
    float were a real number, see SIMACCEL_SHAPE_ENV)."""
    from torch.utils._sympy.symbol import SymT, symbol_is_type
    symbols = _source_symbols()
    ranges = _shape_env().var_to_range
    return [name for name in sources
            if (symbol := symbols.get(name)) is not None and symbol in ranges
            and symbol_is_type(symbol, SymT.FLOAT)]


def _guard_text(out: Any, guard: Any) -> str:
    kind_name = guard.create_fn_name()
    try:
        value = _source_value(out, guard.originating_source)
    except Exception:  # noqa: BLE001 - text only
        return f"{kind_name}: {guard.name}"
    if kind_name in VALUE_GUARDS:
        return f"{kind_name}: {guard.name} == {value!r}"
    if kind_name == "TYPE_MATCH":
        return f"{kind_name}: type({guard.name}) is {type(value).__name__}"
    return f"{kind_name}: {guard.name}"


def _shape_env() -> Any:
    return _output_graph().shape_env


def _source_symbols() -> dict[str, Any]:
    """Source name -> the sympy symbol the shape env created for it."""
    names: dict[str, Any] = {}
    for symbol, sources in _shape_env().var_to_sources.items():
        for source in sources:
            names.setdefault(source.name, symbol)
    return names


def _symbol_text(expr: Any) -> str:
    """``expr`` with each symbol replaced by its source name (``zf3 > 0`` -> ``L['a'] > 0``)."""
    import sympy
    shape_env = _shape_env()
    subs = {s: sympy.Symbol(shape_env.var_to_sources[s][0].name)
            for s in expr.free_symbols if shape_env.var_to_sources.get(s)}
    return str(expr.xreplace(subs))


def symbol_predicates(sources: Iterable[str]) -> dict[str, list[str]]:
    """Shape-env guards that mention each source's symbol, as readable text."""
    symbols = _source_symbols()
    shape_env = _shape_env()
    result: dict[str, list[str]] = {}
    for name in sources:
        symbol = symbols.get(name)
        if symbol is None:
            continue
        result[name] = [_symbol_text(g.expr) for g in shape_env.guards
                        if symbol in g.expr.free_symbols]
    return result


# ---------------------------------------------------------------- after the re-trace

def _placeholders(gm: torch.fx.GraphModule) -> dict[str, tuple[int, torch.fx.Node]]:
    """Source name -> (input index, placeholder node) for the graph's Dynamo inputs."""
    found = {}
    for index, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        grapharg = node.meta.get("grapharg")
        if grapharg is not None and grapharg.source is not None:
            found[grapharg.source.name] = (index, node)
    return found


def inspect_lifted(gm: torch.fx.GraphModule, sources: Iterable[str]) -> dict[str, LiftOutcome]:
    """Classify how each of ``sources`` appears in the re-traced graph ``gm``."""
    out = _output_graph()
    sources = list(sources)
    symbols = _source_symbols()
    placeholders = _placeholders(gm)
    shape_symbols = _tensor_shape_symbols(gm)
    value_guarded = {g.name for g in out.guards if g.create_fn_name() in VALUE_GUARDS}
    predicates = symbol_predicates(sources)
    outcomes = {}
    for name in sources:
        index, node = placeholders.get(name, (None, None))
        symbol = symbols.get(name)
        replaced = out.shape_env.replacements.get(symbol) if symbol is not None else None
        status = ("not_lifted" if name in value_guarded or (symbol is None and node is None)
                  else "specialized" if replaced is not None and replaced.is_number
                  else "shape" if symbol in shape_symbols
                  else "input" if node is not None else "guard_only")
        outcomes[name] = LiftOutcome(
            name, status, node.name if node is not None else None, index,
            node.meta.get("example_value") if node is not None else None,
            tuple(predicates.get(name, ())))
    return outcomes


def scalar_inputs(gm: torch.fx.GraphModule) -> list[tuple[ScalarSite, LiftOutcome]]:
    """Every Python-scalar graph input of ``gm`` (lifted by simaccel or by Dynamo itself).

    Tensor size symbols (``L['x'].size()[0]`` under ``dynamic=True``) are not included.
    """
    from torch._dynamo.source import TensorPropertySource
    out = _output_graph()
    found = []
    predicates = symbol_predicates(_placeholders(gm))
    for name, (index, node) in _placeholders(gm).items():
        grapharg = node.meta["grapharg"]
        if grapharg.is_tensor or isinstance(grapharg.source, TensorPropertySource):
            continue
        try:
            value = _source_value(out, grapharg.source)
        except Exception:  # noqa: BLE001 - fall back to the traced example
            value = grapharg.example
        site = ScalarSite(name, value, value_kind(value), _where(out, grapharg.source), "")
        found.append((site, LiftOutcome(name, "input", node.name, index,
                                        node.meta.get("example_value"),
                                        tuple(predicates.get(name, ())))))
    return found


def _tensor_shape_symbols(gm: torch.fx.GraphModule) -> set[Any]:
    """Symbols that occur in the size/stride of any tensor the graph produces or takes."""
    from torch.fx.experimental.symbolic_shapes import free_symbols
    found: set[Any] = set()
    for node in gm.graph.nodes:
        for leaf in pytree.tree_leaves(node.meta.get("example_value")):
            if isinstance(leaf, torch.Tensor):
                found |= free_symbols(leaf)
    return found


# ---------------------------------------------------------------- per-code memory

# Root code object of a frame -> (its Dynamo frame state, sources that could not be lifted
# there with the reason). Later compiles of the frame skip those sources instead of paying
# for re-traces that would end the same way. Tied to the frame state object so that
# torch._dynamo.reset(), which drops frame state, forgets it too.
_UNLIFTABLE: weakref.WeakKeyDictionary[types.CodeType, tuple[Any, dict[str, str]]] = (
    weakref.WeakKeyDictionary())


def _root_frame() -> tuple[types.CodeType, Any]:
    """The root code object of the compile and its Dynamo frame state (``CodeState``)."""
    from torch._dynamo import pgo
    from torch._dynamo.symbolic_convert import InstructionTranslator
    _output_graph()  # raises a clear error outside a compile
    tx = InstructionTranslator.current_tx()
    return tx.f_code, pgo.get_code_state()[pgo.CodeId.make(tx.f_code, tx.closure)]


def remember_unliftable(reasons: Mapping[str, str]) -> None:
    """Record, for the frame being compiled, sources that must stay specialized (in this
    process, and on disk for the next one: :mod:`simaccel.guards.lift_memory`)."""
    if reasons:
        code, state = _root_frame()
        ref, known = _UNLIFTABLE.get(code, (None, {}))
        if ref is None or ref() is not state:
            known = {}
        known.update(reasons)
        _UNLIFTABLE[code] = (weakref.ref(state), known)
        lift_memory.store(code, reasons)


def unliftable() -> dict[str, str]:
    """Sources of the frame being compiled found unliftable by an earlier compile (of this
    process, or of an earlier process sharing the cache directory)."""
    code, state = _root_frame()
    ref, known = _UNLIFTABLE.get(code, (None, {}))
    here = dict(known) if ref is not None and ref() is state else {}
    return {**lift_memory.load(code), **here}


# ---------------------------------------------------------------- asking for a re-trace

_PENDING: dict[str, RetraceRequest] = {}


def pending_retrace() -> RetraceRequest | None:
    """The request made earlier in this same compile, i.e. ``gm`` is a re-traced graph."""
    return _PENDING.get(current_compile_id())


def request_retrace(sites: Sequence[ScalarSite], before: Mapping[str, tuple[str, ...]],
                    demoted: Mapping[str, str] | None = None) -> NoReturn:
    """Make Dynamo re-trace the frame with ``sites`` as graph inputs; never returns.

    Called a second time in one compile (after ``inspect_lifted`` found sources that must
    stay specialized), it replaces the first request and counts one more round.
    """
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis
    from torch._dynamo.symbolic_convert import InstructionTranslator
    compile_id = current_compile_id()
    previous = _PENDING.pop(compile_id, None)
    if previous is not None:
        _run_undo(previous.undo_config)
        _run_undo(previous.undo_frame_state)
    request = RetraceRequest(compile_id, {s.source: s for s in sites}, dict(before),
                             dict(demoted or {}), previous.rounds + 1 if previous else 1)
    _apply_request(request)
    _PENDING[compile_id] = request
    _ensure_end_callback()
    # Dynamo replays its speculation log on a restart; the re-trace takes other paths
    # (symbolic compares instead of constants), so the old log would diverge.
    InstructionTranslator.current_tx().speculation_log.clear()
    names = ", ".join(request.sites)
    raise TensorifyScalarRestartAnalysis(
        restart_reason=f"simaccel: re-trace to lift scalars {names}")


def _run_undo(actions: list[Callable[[], None]]) -> None:
    while actions:
        actions.pop()()


def _apply_request(request: RetraceRequest) -> None:
    ints = [n for n, s in request.sites.items() if s.kind == "int"]
    floats = [n for n, s in request.sites.items() if s.kind == "float"]
    if ints:
        extra = ",".join(_exact_source_regex(n) for n in ints)
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
    out = _output_graph()
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


def _ensure_end_callback() -> None:
    from torch._dynamo.callback import callback_handler
    # torch._dynamo.reset() clears every callback, so check each time.
    if _on_compile_end not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(_on_compile_end)


def _on_compile_end(_args: Any) -> None:
    """Dynamo finished compiling (outermost compile): undo every config change made."""
    while _PENDING:
        _, request = _PENDING.popitem()
        _run_undo(request.undo_config)


# ---------------------------------------------------------------- backend-added guards

# How a backend guard reaches Dynamo (torch 2.13.0): a ``torch._guards.Guard`` added to the
# OutputGraph's guards set while the backend runs is turned into the frame's guard manager
# tree by ``CheckFunctionManager`` after the backend returns, like Dynamo's own guards. Its
# create function (``SIMACCEL_GUARD``) asks the GuardBuilder for the manager of its source
# and hangs a C++ LAMBDA_GUARD leaf on it; the code part is what Dynamo's printout shows.
# A frame-level guard (no source) instead joins the frame's folded check (SIMACCEL_SHAPE_ENV).
# A check that raises at call time is treated by the C++ leaf as a failed guard: Dynamo
# logs the exception text as the recompile reason and recompiles the frame.

# id(OutputGraph) -> (weak reference to it, its slots). OutputGraph is not hashable; the
# weak reference's callback drops the entry when the OutputGraph goes.
_FRAME_SLOTS: dict[int, tuple[weakref.ref[Any], dict[Any, Any]]] = {}


def frame_slot(factory: Callable[[], Any]) -> Any:
    """A per-frame-compile object (one per OutputGraph, made by ``factory`` on first use).

    A restart of the trace gets a fresh OutputGraph, hence a fresh slot: guards installed
    on an abandoned trace are dropped together with it.
    """
    out = _output_graph()
    ref, slots = _FRAME_SLOTS.get(id(out), (None, {}))
    if ref is None or ref() is not out:
        key = id(out)
        slots = {}
        _FRAME_SLOTS[key] = (weakref.ref(out, lambda _: _FRAME_SLOTS.pop(key, None)), slots)
    if factory not in slots:
        slots[factory] = factory()
    return slots[factory]


def in_resume_frame() -> bool:
    """Whether the frame being compiled is Dynamo's continuation after a graph break."""
    from torch._dynamo.resume_execution import TORCH_DYNAMO_RESUME_IN_PREFIX
    from torch._dynamo.symbolic_convert import InstructionTranslator
    _output_graph()  # raises a clear error outside a compile
    return InstructionTranslator.current_tx().f_code.co_name.startswith(
        TORCH_DYNAMO_RESUME_IN_PREFIX)


def resolve_source(text: str | None) -> Any:
    """The Dynamo ``Source`` named by ``text`` (``L['x']``, ``G['CFG']['k']``, ``L['m'].a``).

    ``None`` is the frame itself (the root of the guard tree). A graph input's own source
    object is reused when its name matches. Raises ``ValueError`` for text that is not a
    chain of ``L[...]``/``G[...]``, ``.attr`` and ``[constant]``, ``LookupError`` when the
    frame has no such value.
    """
    from torch._dynamo import source as S
    out = _output_graph()
    if text is None:
        return S.GlobalStateSource()
    (scope, name), steps = parse_source(text)
    source = S.LocalSource(name) if scope == "L" else S.GlobalSource(name)
    for step, key in steps:
        if step == "attr":
            source = S.AttrSource(source, key)
            continue
        try:
            container = _source_value(out, source)
        except Exception:  # noqa: BLE001 - reported below, on the full source
            container = None
        source = (S.DictGetItemSource if isinstance(container, dict) else S.GetItemSource)(
            source, key)
    known = _graph_arg_sources(out).get(source.name)
    if known is not None and not known.guard_source.is_specialized_nn_module():
        source = known
    try:
        _source_value(out, source)
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


def frame_value(source: Any) -> Any:
    """The value behind ``source`` in the frame being compiled (the frame's locals for the
    frame-level source)."""
    from torch._dynamo.source import GlobalStateSource
    out = _output_graph()
    if isinstance(source, GlobalStateSource):
        return out.local_scope
    return _source_value(out, source)


def eval_frame_expression(expr: str) -> Any:
    """``expr``, Python over ``L`` (the frame's locals) and ``G`` (its globals), evaluated
    on the frame being compiled, as a folded guard check evaluates it on a call."""
    out = _output_graph()
    return eval(expr, {"L": out.local_scope, "G": out.global_scope})  # noqa: S307


def install_lambda_guard(source: Any, guard_fn: Callable[[Any], object], code_part: str) -> None:
    """Add ``guard_fn(value)`` to the frame's guards as a LAMBDA_GUARD on ``source``'s
    manager, shown as ``code_part``. A frame-level check (``source`` is the frame) joins
    the frame's folded check instead (see :func:`SIMACCEL_SHAPE_ENV`)."""
    from torch._dynamo.source import GlobalStateSource
    from torch._guards import Guard as DynamoGuard
    if isinstance(source, GlobalStateSource) and _fold_frame_check(guard_fn, code_part):
        return
    create = functools.partial(SIMACCEL_GUARD, guard_fn=guard_fn, code_part=code_part)
    _output_graph().guards.add(DynamoGuard(source, create), collect_debug_stack=False)


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


# ---------------------------------------------------------------- one Python check per frame

# Dynamo evaluates all shape-env guards of a frame in one Python lambda (an "epilogue"
# LAMBDA_GUARD on the root, run after every other guard passed). For a lifted frame those
# are ``not math.isnan(L['a'])`` per lifted float and simaccel's int-slot range per lifted
# int; simaccel's frame-level guards (the device config) were one more root lambda each.
# Each lambda is a C++ -> Python call per frame call, which made guard evaluation with
# lifting slower than with lift="off" (whose EQUALS_MATCH guards are C++ only). So
# simaccel swaps the frame's SHAPE_ENV guard for SIMACCEL_SHAPE_ENV: it runs Dynamo's own
# SHAPE_ENV create function, takes the Python code it would have installed, and installs
# one function (simaccel.guards.folded) that runs simaccel's frame-level checks and those
# same shape-env checks. Nothing is dropped: the same checks run, in one call.
#
# Dynamo's NaN guard stays even for a float that only feeds tensor arithmetic: the shape
# env decides comparisons such as ``a == a``, ``a != a`` or ``a - a == 0.0`` at trace time
# as if ``a`` were a real number, leaving no guard and no graph node behind (the graph of
# ``x * a if a == a else -x`` is the graph of ``x * a``). Only the NaN guard makes those
# decisions valid, and the traced graph cannot prove none was made
# (tests/guards/test_folded_guards.py shows such a frame).


@dataclasses.dataclass
class _FrameChecks:
    """simaccel's frame-level checks of one frame compile, as parts of the folded check.

    ``closure``: the objects the parts' expressions name. ``folding``: None until the first
    check asks; then whether the frame's SHAPE_ENV guard could be swapped (False: each
    check is installed as a root lambda of its own instead).
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
                               {"G": _output_graph().global_scope})
    install_lambda_guard(GlobalStateSource(), check, code_part)


def _fold_frame_check(guard_fn: Callable[[Any], object], code_part: str) -> bool:
    """Queue ``guard_fn(frame_locals)`` for the frame's folded check; False if it cannot."""
    return _fold_frame_expression("{check}(L)", {"check": guard_fn}, code_part)


def _fold_frame_expression(template: str, objects: Mapping[str, object], text: str) -> bool:
    frame = frame_slot(_FrameChecks)
    if frame.folding is None:
        frame.folding = _swap_shape_env_guard(frame)
    if frame.folding:
        names = {key: f"___simaccel_frame{len(frame.parts)}_{key}" for key in objects}
        frame.closure.update({names[key]: value for key, value in objects.items()})
        frame.parts.append(FoldedPart(template.format(**names), text))
    return frame.folding


def _swap_shape_env_guard(frame: _FrameChecks) -> bool:
    """Replace the frame's SHAPE_ENV guard by SIMACCEL_SHAPE_ENV bound to ``frame``."""
    from torch._dynamo.guards import GuardBuilder
    from torch._guards import Guard as DynamoGuard
    guards = _output_graph().guards
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


def SIMACCEL_SHAPE_ENV(builder: Any, guard: Any, *, frame: _FrameChecks) -> None:  # noqa: N802
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


def _folded_parts(frame: _FrameChecks, captured: Sequence[tuple[list[str], list[str],
                                                                 dict[str, object]]]
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


def graph_inputs(gm: torch.fx.GraphModule) -> list[GraphInput]:
    """Every placeholder of ``gm`` with its source and current frame value."""
    from torch._dynamo.source import TensorPropertySource
    out = _output_graph()
    found = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for index, node in enumerate(placeholders):
        grapharg = node.meta.get("grapharg")
        source = getattr(grapharg, "source", None)
        example = node.meta.get("example_value")
        if source is None:
            found.append(GraphInput(index, None, example))
            continue
        prop = None
        try:
            if isinstance(source, TensorPropertySource):
                method = source.prop.method_name()
                prop = (source.base.name, method, source.idx)
                base = _source_value(out, source.base)
                value = getattr(base, method)(*(() if source.idx is None else (source.idx,)))
            else:
                value = _source_value(out, source)
        except Exception:  # noqa: BLE001 - callers treat the example conservatively
            value = example
        found.append(GraphInput(index, source.name, value, prop))
    return found


def guard_symint_range(value: Any, low: int, high_exclusive: int) -> bool | None:
    """Record ``low <= value < high_exclusive`` for a SymInt as a shape-env guard of the
    frame being compiled (evaluated with Dynamo's other shape-env guards, inside the
    frame's folded check when simaccel's device guards are installed: ~35 ns per call,
    no Python call of its own). Returns the result at compile time, or None if ``value`` is not
    a backed SymInt."""
    node = getattr(value, "node", None)
    if not isinstance(value, torch.SymInt) or node is None or node.hint is None:
        return None
    from torch.fx.experimental.symbolic_shapes import guard_bool
    # One boolean expression, so the guard is "fits" or "does not fit", not two ranges.
    return guard_bool((value >= low) & (value < high_exclusive))


def has_static_address(value: Any) -> bool:
    """True if ``value`` is a tensor marked with ``torch._dynamo.mark_static_address`` (the
    mark is a private attribute of Dynamo's; Dynamo also marks the parameters and buffers
    of the modules it inlines)."""
    return getattr(value, "_dynamo_static_input_type", None) is not None


# ---------------------------------------------------------------- AOTAutograd's runtime wrapper

def runtime_wrapper_needed(frame_gm: torch.fx.GraphModule, graph: torch.fx.GraphModule,
                           frame_inputs: int, autocast: bool) -> str | None:
    """Why the inference graph AOTAutograd is compiling needs AOTAutograd's runtime
    wrapper around it, or None when calling it directly with the frame's arguments is
    exactly what the wrapper would do. Call it inside the inference compiler; ``autocast``:
    whether autocast was on when Dynamo called the backend (AOTAutograd turns it off while
    it traces, so it cannot be read here).

    The wrapper (~8 us a call on the 2-core machine: two Dynamo-disable frames, grad-mode
    and autocast switches, output handling) exists for input mutations, outputs that alias
    inputs or each other, effect tokens, tensor subclasses, functionalized RNG, parameters
    the module holds itself, inputs AOTAutograd deduplicated, and autocast (the graph has
    its casts baked in, so torch ops run by host fallbacks or library kernels must not
    autocast again). Its metadata (``ViewAndMutationMeta``) is AOTAutograd's private state.
    """
    from torch._dynamo.utils import GmWrapper
    from torch._functorch._aot_autograd.schemas import OutputType, SubclassCreationMeta
    from torch._guards import TracingContext
    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    placeholders = sum(1 for n in graph.graph.nodes if n.op == "placeholder")
    checks = (
        (meta is None, "AOTAutograd gave no graph metadata"),
        (isinstance(frame_gm, GmWrapper), "Dynamo passes this frame's inputs boxed"),
        (placeholders != frame_inputs,
         "the graph's inputs are not the frame's (module-held parameters or deduplicated "
         "inputs)"),
        (autocast, "autocast is enabled"),
    )
    for failed, reason in checks:
        if failed:
            return reason
    if any(i.mutates_data or i.mutates_metadata for i in meta.input_info):
        return "the graph mutates an input"
    if any(o.output_type != OutputType.non_alias for o in meta.output_info) \
            or meta.num_intermediate_bases:
        return "an output aliases an input or another output"
    if meta.tokens or meta.is_rng_op_functionalized \
            or any(isinstance(m, SubclassCreationMeta) for m in meta.subclass_inp_meta):
        return "effect tokens, functionalized RNG or a tensor subclass input"
    return None

"""One ATen trace for an inference graph that AOTAutograd would trace twice for nothing.

AOTAutograd traces a Dynamo graph twice: a metadata pass (functionalized, on fake tensors)
that finds what the graph mutates and which outputs alias, then a functionalized
``make_fx`` capture. On a cold GPT-2-style forward that is ~0.45 s; one plain ``make_fx``
trace of the same graph under Dynamo's fake mode, with the same decompositions, is
~0.2 s. Take a graph that needs no gradient, has static shapes, mutates nothing and
returns no alias of an input or of another output. (Lifted floats, read with ``.item()``,
are allowed: the tensorify pass runs as under AOTAutograd; so are lifted ints, backed
SymInts beside the tensors, which the trace takes as int placeholders as AOTAutograd's
does: a frame lifting an int no longer pays AOTAutograd's two passes.)
Functionalization has nothing to rewrite in it and AOTAutograd's runtime wrapper nothing
to do, so the one trace gives the graph AOTAutograd would have given, and the backend
calls its program directly.

Anything else goes to AOTAutograd, and :func:`compile_inference_once` says why: a
traced graph found to mutate or alias after all, or a trace that fails (AOTAutograd's
own trace then runs, and fails the same way or not).

Private parts of torch used here (2.13): ``TracingContext`` (Dynamo's fake mode and
whether DDPOptimizer wants fake outputs), ``GmWrapper``, ``dynamo_timed`` (so the trace
is reported as the ``aot_autograd`` phase it replaces), ``enable_python_dispatcher``,
``preserve_rng_state``, ``StorageWeakRef`` and AOTAutograd's tensorify pass.
"""
from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from simaccel.guards.dynamo.aot import frame_call_reason, module_held
from simaccel.guards.dynamo.values import has_symbolic_layout

__all__ = ["compile_inference_once", "why_not_traced_once"]

log = logging.getLogger("simaccel")

#: Dynamo-graph call targets that write to a tensor (the ``i``-operators are in place
#: on tensors); a name ending in ``_`` is in place too (``add_``, ``torch.relu_``)
_WRITING_TARGETS = frozenset({operator.setitem, operator.iadd, operator.isub,
                              operator.imul, operator.itruediv, operator.ifloordiv,
                              operator.imod, operator.ipow, operator.iand, operator.ior,
                              operator.ixor, operator.ilshift, operator.irshift,
                              operator.imatmul})


def compile_inference_once(frame_gm: torch.fx.GraphModule, example_inputs: list[Any],
                           decompositions: dict[Any, Callable[..., Any]],
                           compiler: Callable[[torch.fx.GraphModule, list[Any]], Any],
                           autocast: bool) -> Any:
    """``compiler(graph, fake_inputs)`` on the frame graph traced once to ATen (see the
    module doc), or a string saying why the graph needs AOTAutograd. ``autocast``:
    whether autocast was on when Dynamo called the backend. Timed as Dynamo's
    ``create_aot_dispatcher_function`` (simaccel's ``aot_autograd`` phase), which this
    replaces; the compiler runs under Dynamo's fake mode, as AOTAutograd runs it."""
    from torch._dynamo.exc import RestartAnalysis
    from torch._dynamo.utils import dynamo_timed
    reason = why_not_traced_once(frame_gm, example_inputs, autocast)
    if reason is not None:
        return reason
    fake_mode = _tracing_context().fake_mode
    with dynamo_timed("create_aot_dispatcher_function"):
        fakes = _fake_inputs(example_inputs, fake_mode)
        if any(isinstance(fake, torch.Tensor) and has_symbolic_layout(fake) for fake in fakes):
            return "an input has symbolic sizes"
        try:
            graph = _trace(frame_gm, fakes, decompositions, fake_mode)
        except RestartAnalysis:
            raise
        except Exception as exc:  # noqa: BLE001 - AOTAutograd's trace runs it again
            log.debug("simaccel: the single ATen trace failed", exc_info=True)
            first_line = (str(exc).strip().splitlines() or [""])[0][:160]
            return f"the single trace failed: {type(exc).__name__}: {first_line}"
        reason = _traced_graph_reason(graph, fakes)
        if reason is not None:
            return reason
        graph.graph.eliminate_dead_code()
        graph.recompile()
        _tensorify_lifted_floats(graph, fake_mode)
        with fake_mode:
            return compiler(graph, fakes)


def why_not_traced_once(frame_gm: torch.fx.GraphModule, example_inputs: list[Any],
                        autocast: bool) -> str | None:
    """Why the frame graph cannot be traced once (a reason read off the Dynamo graph and
    its inputs before any tracing), or None."""
    context = _tracing_context()
    if context is None or context.fake_mode is None:
        return "Dynamo gave no fake mode"
    reason = frame_call_reason(frame_gm, autocast)
    if reason is not None:
        return reason
    # in order, each check relying on the ones before it (lazily evaluated)
    checks: tuple[tuple[Callable[[], bool], str], ...] = (
        (lambda: getattr(context, "ddp_optimizer_ctx", None) is not None,
         "a DDPOptimizer split"),
        (lambda: not all(map(_plain_input, example_inputs)),
         "an input is neither a plain tensor nor a backed int (a tensor subclass, an "
         "unbacked int or a scalar of another type)"),
        (lambda: torch.is_grad_enabled() and any(
            isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs),
         "the graph is traced for training"),
        (lambda: bool(module_held(frame_gm)), "the frame module holds parameters or buffers"),
    )
    for failed, text in checks:
        if failed():
            return text
    return _dynamo_graph_reason(frame_gm)


def _dynamo_graph_reason(frame_gm: torch.fx.GraphModule) -> str | None:
    """What in the Dynamo graph needs AOTAutograd: a write to a tensor (functionalization
    rewrites it), a higher-order op, a symbolic size or scalar."""
    for node in frame_gm.graph.nodes:
        if node.op in ("call_function", "call_method") and _writes(node):
            return f"'{node.name}' writes to a tensor in place"
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            return f"'{node.name}' is a higher-order op"
        value = node.meta.get("example_value")
        if isinstance(value, (torch.SymInt, torch.SymBool, torch.SymFloat)) \
                and not value.node.has_hint() \
                or (isinstance(value, torch.Tensor) and has_symbolic_layout(value)):
            return f"'{node.name}' has a symbolic size or a data-dependent scalar"
    return None


def _plain_input(value: Any) -> bool:
    """A plain tensor, or a backed symbolic int (a lifted int, a size): make_fx traces
    it as an int placeholder, as AOTAutograd's capture does."""
    if isinstance(value, torch.SymInt):
        return value.node.has_hint()
    return type(value) in (torch.Tensor, torch.nn.Parameter)


def _tensorify_lifted_floats(graph: torch.fx.GraphModule, fake_mode: Any) -> None:
    """AOTAutograd's tensorify pass as simaccel runs it (:mod:`.tensorify`), on the traced
    graph, where AOTAutograd runs it on its own: a lifted float (``.item()`` of a 0-d
    graph input, a SymFloat) becomes tensor ops, or a scalar argument the lowering reads
    from the constant bank. It may restart Dynamo's analysis, as under AOTAutograd."""
    from torch._functorch._aot_autograd import graph_compile
    from simaccel.guards.dynamo.tensorify import simaccel_tensorify
    if fake_mode.shape_env is not None:
        simaccel_tensorify(graph_compile.tensorify_python_scalars)(
            graph, fake_mode.shape_env, fake_mode)


def _writes(node: torch.fx.Node) -> bool:
    """Whether a Dynamo-graph call writes to a tensor: an in-place method or function,
    an in-place operator, ``out=`` or ``inplace=True``."""
    target = node.target
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    in_place_name = name.endswith("_") and not name.endswith("__")
    return (in_place_name or target in _WRITING_TARGETS or "out" in node.kwargs
            or node.kwargs.get("inplace") is True)


def _fake_inputs(example_inputs: list[torch.Tensor], fake_mode: Any) -> list[torch.Tensor]:
    """The fake tensors Dynamo traced the inputs as, made as AOTAutograd makes them
    (its ``process_inputs``): with Dynamo's symbolic context and source, so that a lifted
    float's 0-d tensor comes with its SymFloat (``item_memo``)."""
    contexts = _tracing_context().tensor_to_context
    fakes = []
    with fake_mode:
        for x in example_inputs:
            if isinstance(x, torch.SymInt):
                fakes.append(x)  # traced as Dynamo's symbol, as AOTAutograd passes it
                continue
            context = contexts[x] if x in contexts else None
            fakes.append(fake_mode.from_tensor(
                x, symbolic_context=context, trace=context is None,
                source=None if context is None else context.tensor_source))
    return fakes


def _trace(frame_gm: torch.fx.GraphModule, fakes: list[torch.Tensor],
           decompositions: dict[Any, Callable[..., Any]], fake_mode: Any) -> torch.fx.GraphModule:
    """The frame graph run node by node under ``make_fx`` with the decompositions, in
    the contexts AOTAutograd traces in (Dynamo's fake mode, the Python dispatcher, the
    RNG state kept, node metadata carried over to the ATen nodes)."""
    from torch._dynamo.utils import preserve_rng_state
    from torch.fx import traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import enable_python_dispatcher

    def run(*args: Any) -> Any:
        return torch.fx.Interpreter(frame_gm).run(*args)

    with contextlib.ExitStack() as stack:
        for context in (torch.autograd.set_multithreading_enabled(False),
                        preserve_rng_state(), fake_mode, enable_python_dispatcher(),
                        fx_traceback.preserve_node_meta()):
            stack.enter_context(context)
        return make_fx(run, decomposition_table=decompositions,
                       record_module_stack=True)(*fakes)


def _traced_graph_reason(graph: torch.fx.GraphModule, fakes: list[torch.Tensor]) -> str | None:
    """What in the traced ATen graph needs AOTAutograd after all: an op that mutates a
    tensor, a higher-order op, an output that is not a tensor or aliases an input or
    another output."""
    from torch.multiprocessing.reductions import StorageWeakRef
    for node in graph.graph.nodes:
        if node.op != "call_function":
            continue
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            return f"the ATen graph has a higher-order op ({node.target})"
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            return f"the ATen graph mutates a tensor ({node.target})"
    outputs = next(n for n in reversed(graph.graph.nodes) if n.op == "output").args[0]
    if not isinstance(outputs, (list, tuple)):
        return "the graph's output is not a tuple"
    seen = {StorageWeakRef(fake.untyped_storage()) for fake in fakes
            if isinstance(fake, torch.Tensor)}
    for out in outputs:
        value = out.meta.get("val") if isinstance(out, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor):
            return "an output is not a tensor"
        storage = StorageWeakRef(value.untyped_storage())
        if storage in seen:
            return "an output aliases an input or another output"
        seen.add(storage)
    return None


def _tracing_context() -> Any:
    from torch._guards import TracingContext
    return TracingContext.try_get()

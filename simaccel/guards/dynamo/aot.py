"""AOTAutograd for the backend: its entry point, the ATen decompositions it applies, and
whether its runtime wrapper is needed.

``torch._functorch`` and ``torch._decomp`` are private modules; the backend reaches them
through these names (``aot_module_simplified`` is the entry point torch's own backends
use, with the tensorify pass adjusted: :mod:`.tensorify`).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch.fx
from torch._functorch import aot_autograd

from simaccel.guards.dynamo.tensorify import symbolic_scalar_arguments

__all__ = ["aot_module_simplified", "backend_placeholder", "core_aten_decomposition_table",
           "decompositions_for", "DirectCall", "direct_call", "frame_call_reason",
           "frame_graph_copy", "module_held"]


def aot_module_simplified(gm: torch.fx.GraphModule, example_inputs: list[Any],
                          **kwargs: Any) -> Callable[..., Any]:
    """``torch._functorch.aot_autograd.aot_module_simplified`` (the entry point torch's own
    backends use), with the scalar arguments simaccel lowers itself kept symbolic by the
    tensorify pass (:mod:`.tensorify`).

    Input mutations stay in the graph as ``copy_(input, value)``
    (``keep_inference_input_mutations``, as inductor asks): the program writes the new
    value into the caller's tensor itself, instead of returning it for the runtime
    wrapper's epilogue to copy (an output allocation and a host copy per mutated input
    per call).

    Counted in ``counters["aot_autograd"]["total"]`` as torch's ``aot_autograd`` backend
    helper counts it: DDPOptimizer reads that counter to know AOTAutograd compiled a
    split, and only then makes the split's first call at compile time, on fake tensors
    (otherwise the fake outputs AOTAutograd prepared reach the user's first real call)."""
    from torch._dynamo.utils import counters
    counters["aot_autograd"]["total"] += 1
    if "bw_compiler" in kwargs:
        kwargs["bw_compiler"] = _untraced_backward_compiler(kwargs["bw_compiler"])
    kwargs.setdefault("keep_inference_input_mutations", True)
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    kwargs.setdefault("partition_fn", min_cut_rematerialization_partition)
    with symbolic_scalar_arguments():
        return aot_autograd.aot_module_simplified(gm, example_inputs, **kwargs)


def _untraced_backward_compiler(compiler: Callable[..., Any]) -> Callable[..., Any]:
    """``compiler`` as AOTAutograd may call it from inside a compiled frame: AOTAutograd
    compiles the backward at the first ``backward()``, which a compiled training step
    (``loss.backward()`` inside ``torch.compile``) runs with Dynamo's frame hook still
    installed, so Dynamo would trace the compiler's own Python and then the backward it
    returns. Both run with Dynamo disabled, as torch's ``aot_autograd`` backend helper
    does for its backends. The backward keeps its calling convention (AOTAutograd reads
    ``_boxed_call``)."""
    import torch._dynamo

    def compile_backward(*args: Any, **kwargs: Any) -> Any:
        compiled = compiler(*args, **kwargs)
        run = torch._dynamo.disable(compiled, reason="simaccel runs the backward")
        run._boxed_call = getattr(compiled, "_boxed_call", False)
        return run

    # the frame Dynamo's hook meets is torch's disable wrapper: nothing of ours is traced
    # (nor counted as a graph break)
    return torch._dynamo.disable(compile_backward, reason="simaccel compiles the backward")


def frame_graph_copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of Dynamo's graph module whose graph the backend may give inputs of its own
    (:func:`backend_placeholder`): Dynamo shares its graph with the module it hands the
    backend and reads that graph's placeholders again after the backend returns. The copy
    keeps what AOTAutograd reads off a Dynamo graph (private): the module's ``meta`` and
    ``_param_name_to_source``, each placeholder's ``_dynamo_source``; nodes keep their
    ``meta`` (example values, Dynamo's ``grapharg``: the same objects)."""
    copied: dict[torch.fx.Node, torch.fx.Node] = {}
    graph = torch.fx.Graph()
    graph._codegen = gm.graph._codegen
    graph.output(graph.graph_copy(gm.graph, copied))
    for old, new in copied.items():
        if hasattr(old, "_dynamo_source"):
            new._dynamo_source = old._dynamo_source
    module = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    module.meta.update(gm.meta)
    if hasattr(gm, "_param_name_to_source"):
        module._param_name_to_source = gm._param_name_to_source
    return module


def backend_placeholder(graph: torch.fx.Graph, name: str) -> torch.fx.Node:
    """A placeholder after ``graph``'s last one (a :func:`frame_graph_copy`) for an input
    the backend passes itself, after the frame's arguments. AOTAutograd maps each
    placeholder of a Dynamo graph to its source in user code (``Node._dynamo_source``):
    this one has none, as DDPOptimizer's placeholders for values between its splits."""
    placeholders = list(graph.find_nodes(op="placeholder"))
    anchor = graph.inserting_after(placeholders[-1]) if placeholders \
        else graph.inserting_before(next(iter(graph.nodes)))
    with anchor:
        node = graph.placeholder(name)
    node._dynamo_source = None
    return node


def decompositions_for(ops: Iterable[Any]) -> dict[Any, Callable[..., Any]]:
    """torch's decompositions of ``ops`` (ATen overload packets or overloads), by overload
    (``torch._decomp.get_decompositions``)."""
    from torch._decomp import get_decompositions
    return get_decompositions(list(ops))


def core_aten_decomposition_table() -> dict[Any, Callable[..., Any]]:
    """The ATen part of ``torch._decomp.core_aten_decompositions()``.

    That table also lists every CompositeImplicitAutograd op (for torch.export), and
    finding them walks all of ATen (~50 ms of a warm compile); AOTAutograd decomposes those
    ops by dispatch anyway. The part after autograd is a private function of
    ``torch._decomp``; another torch gets the whole public table.
    """
    try:
        from torch._decomp import _core_aten_decompositions_post_autograd
    except ImportError:  # pragma: no cover - other torch versions
        from torch._decomp import core_aten_decompositions
        return dict(core_aten_decompositions())
    return _core_aten_decompositions_post_autograd()


@dataclass(frozen=True)
class DirectCall:
    """How to call an inference graph without AOTAutograd's runtime wrapper and do what
    the wrapper would: ``held``, the frame module's own parameters and buffers, which
    AOTAutograd passes before the frame's arguments (an optimizer's state that Dynamo
    installs as graph attributes); ``bumped``, the graph input positions whose version
    counter is incremented before each call (input mutations kept in the graph, as an
    in-place op bumps them in eager)."""

    held: tuple[torch.Tensor, ...] = ()
    bumped: tuple[int, ...] = ()


def direct_call(frame_gm: torch.fx.GraphModule, graph: torch.fx.GraphModule,
                frame_inputs: int, autocast: bool) -> DirectCall | str:
    """The :class:`DirectCall` of the inference graph AOTAutograd is compiling, or why it
    needs AOTAutograd's runtime wrapper around it. Call it inside the inference compiler;
    ``autocast``: whether autocast was on when Dynamo called the backend (AOTAutograd turns
    it off while it traces, so it cannot be read here).

    The wrapper (~8-15 us a call on the 2-core machine: two Dynamo-disable frames,
    grad-mode and autocast switches, output handling) exists for input mutations it
    applies itself (metadata, or data it cannot leave to the graph), outputs that alias
    inputs or each other, effect tokens, tensor subclasses, functionalized RNG, inputs
    AOTAutograd deduplicated or merged, and autocast (the graph has its casts baked in,
    so torch ops run by host fallbacks or library kernels must not autocast again). Data
    mutations kept in the graph need only their version bump. The metadata
    (``ViewAndMutationMeta``) is AOTAutograd's private state.
    """
    from torch._guards import TracingContext
    meta = getattr(TracingContext.try_get(), "fw_metadata", None)
    placeholders = sum(1 for n in graph.graph.nodes if n.op == "placeholder")
    held = module_held(frame_gm)
    if meta is None:
        return "AOTAutograd gave no graph metadata"
    reason = frame_call_reason(frame_gm, autocast)
    if reason is None and placeholders != len(held) + frame_inputs:
        reason = "the graph's inputs are not the frame's (deduplicated or merged inputs)"
    if reason is not None:
        return reason
    reason = metadata_reason(meta)
    if reason is not None:
        return reason
    return DirectCall(held, tuple(meta.mutated_graph_handled_indices_seen_by_autograd))


def frame_call_reason(frame_gm: torch.fx.GraphModule, autocast: bool) -> str | None:
    """Why Dynamo cannot call this frame's compiled graph directly, whatever the graph
    computes: its inputs come boxed, autocast was on when Dynamo called the backend (the
    graph has its casts baked in), or DDPOptimizer takes fake outputs from the first
    call. None if nothing here stands in the way."""
    from torch._dynamo.utils import GmWrapper
    from torch._guards import TracingContext
    if isinstance(frame_gm, GmWrapper):
        return "Dynamo passes this frame's inputs boxed"
    if autocast:
        return "autocast is enabled"
    if getattr(TracingContext.try_get(), "fakify_first_call", False):
        return "DDPOptimizer takes fake outputs from the first call"
    return None


def module_held(frame_gm: torch.fx.GraphModule) -> tuple[torch.Tensor, ...]:
    """The tensors AOTAutograd's ``aot_module_simplified`` passes before the frame's
    arguments, in its order (parameters, then buffers, duplicates kept)."""
    params = dict(frame_gm.named_parameters(remove_duplicate=False))
    buffers = dict(frame_gm.named_buffers(remove_duplicate=False))
    return (*params.values(), *buffers.values())


def metadata_reason(meta: Any) -> str | None:
    """What in AOTAutograd's ``ViewAndMutationMeta`` needs the wrapper, or None."""
    from torch._functorch._aot_autograd.schemas import (MutationType, OutputType,
                                                        SubclassCreationMeta)
    if any(i.mutation_type not in (MutationType.NOT_MUTATED, MutationType.MUTATED_IN_GRAPH)
           or i.mutates_metadata for i in meta.input_info):
        return "the graph mutates an input's metadata, or its data outside the graph"
    if any(o.output_type != OutputType.non_alias for o in meta.output_info) \
            or meta.num_intermediate_bases:
        return "an output aliases an input or another output"
    if meta.tokens or meta.is_rng_op_functionalized \
            or any(isinstance(m, SubclassCreationMeta) for m in meta.subclass_inp_meta):
        return "effect tokens, functionalized RNG or a tensor subclass input"
    return None


# AOTAutograd's partitioner (torch 2.13, ``torch/_functorch/partitioners.py``) keeps node
# names across the split: a saved value is a forward output and a backward placeholder of
# the same name; a saved forward input keeps its ``primals_N`` name; grad outputs are
# ``tangents_N``.
def backward_input_origins(forward: torch.fx.GraphModule, backward: torch.fx.GraphModule
                           ) -> list[tuple[str, int]]:
    """Per backward placeholder: ``("forward_input", k)`` for the forward graph's input
    ``k``, ``("forward_output", j)`` for its output ``j`` (a saved value), or
    ``("tangent", -1)`` / ``("unknown", -1)``."""
    inputs = {n.name: k for k, n in enumerate(
        n for n in forward.graph.nodes if n.op == "placeholder")}
    output = next(n for n in reversed(forward.graph.nodes) if n.op == "output")
    values = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    outputs: dict[str, int] = {}
    for j, value in enumerate(values):
        if isinstance(value, torch.fx.Node):
            outputs.setdefault(value.name, j)
    origins = []
    for node in backward.graph.nodes:
        if node.op != "placeholder":
            continue
        if node.name in inputs:
            origins.append(("forward_input", inputs[node.name]))
        elif node.name in outputs:
            origins.append(("forward_output", outputs[node.name]))
        elif node.name.startswith("tangents"):
            origins.append(("tangent", -1))
        else:
            origins.append(("unknown", -1))
    return origins


#: Dynamo's own compile timers (``dynamo_timed`` keys in ``compilation_time_metrics``,
#: torch 2.13) reported as simaccel's frame-level compile phases
FRAME_TIMERS = {"bytecode_tracing": "dynamo trace",
                "create_aot_dispatcher_function": "aot_autograd",
                "build_guards": "build guards"}


def frame_compile_seconds() -> dict[str, list[float]]:
    """Seconds of Dynamo's frame-level compile phases in this process (each
    measurement; cleared by ``torch._dynamo.reset()``), named as
    :func:`simaccel.timers.compile_times` reports them."""
    from torch._dynamo.utils import compilation_time_metrics
    return {name: list(compilation_time_metrics.get(key, ()))
            for key, name in FRAME_TIMERS.items()}


def version_bumped_inputs(graph: torch.fx.GraphModule) -> frozenset[int] | None:
    """The inputs (placeholder positions) of the graph AOTAutograd is compiling whose
    version counter its runtime wrapper increments before each call (input mutations
    kept in the graph that autograd sees); None when AOTAutograd's metadata does not line
    up with the graph's inputs (then the caller assumes nothing). Call it inside the
    forward or inference compiler; the metadata (``ViewAndMutationMeta``) is private."""
    from torch._guards import TracingContext
    meta = getattr(TracingContext.try_get(), "fw_metadata", None)
    placeholders = sum(1 for n in graph.graph.nodes if n.op == "placeholder")
    if meta is None or len(getattr(meta, "input_info", ())) != placeholders:
        return None
    try:
        return frozenset(meta.mutated_graph_handled_indices_seen_by_autograd)
    except AttributeError:
        return None

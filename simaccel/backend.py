"""The ``simaccel`` torch.compile backend: guards -> AOTAutograd -> codegen -> runtime.

Registered under the ``torch_dynamo_backends`` entry point, so
``torch.compile(model, backend="simaccel")`` works without importing simaccel.
"""
from __future__ import annotations

import functools
import itertools
import logging
import os
import time
from typing import Any, Callable

import torch
import torch.fx

from simaccel.attention import ATTENTION_DECOMPOSITIONS
from simaccel.attention_rewrite import fuse_softmax_attention
from simaccel.codegen.compile import assemble
from simaccel.codegen.graph import GraphLowering
from simaccel.codegen.sizes import is_symbolic
from simaccel.compiled import CompiledGraph, direct_caller, graph_outputs
from simaccel.dropout_rng import SEED_EXAMPLE, seed_active_dropouts, seeded
from simaccel.errors import UnsupportedOpError
from simaccel.guards import dynamo, first_trace, prepare_frame
from simaccel.guards.buckets import bucket_guards
from simaccel.guards.dynamo import (aot_module_simplified, core_aten_decomposition_table,
                                    decompositions_for, errors_reach_user,
                                    direct_call, unset_fake_temporarily)
from simaccel.input_plan import (InputFacts, backward_input_facts, bank_dtypes,
                                 forward_input_facts, frame_input_facts, plan_inputs,
                                 training_facts)
from simaccel.layer_norm import defers_layer_norm, expand_layer_norms
from simaccel.options import Options, parse_options
from simaccel.pre_aot import drop_inactive_dropouts
from simaccel.report import CompileReport, add_report
from simaccel.runtime.device import get_device
from simaccel.runtime.program import Program
from simaccel.staged import compile_staged, has_data_dependent_sizes
from simaccel.timers import PhaseTimer

log = logging.getLogger("simaccel")
aten = torch.ops.aten

#: ops decomposed before lowering, beyond core ATen: normalisations, softmax, activations
#: and their backwards become reductions and pointwise chains the fuser handles.
_EXTRA_DECOMPS = [
    aten.native_layer_norm, aten.native_layer_norm_backward, aten._softmax,
    aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data,
    aten.gelu_backward, aten.silu_backward, aten.sigmoid_backward, aten.tanh_backward,
    aten.threshold_backward, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit,
    aten.native_batch_norm_backward, aten.embedding_dense_backward,
    aten.hardtanh, aten.leaky_relu,
    aten.mse_loss, aten.mse_loss_backward, aten.nll_loss_forward, aten.nll_loss_backward,
    aten.addcmul, aten.addcdiv, aten.logit, aten.hardswish, aten.hardsigmoid, aten.elu,
    aten.softplus, aten.std, aten.var_mean, aten.linalg_vector_norm, aten.norm,
    aten.native_group_norm, aten.native_group_norm_backward,
    # op coverage (issue 14): ops whose decomposition is pointwise, GEMM or gather work
    aten.ldexp, aten.addmv, aten.dist, aten.grid_sampler_2d,
    aten._batch_norm_with_update_functional, aten.batch_norm_backward,
    aten.reflection_pad1d_backward, aten.reflection_pad2d_backward,
    aten.reflection_pad3d_backward,
]


@functools.lru_cache(maxsize=2)
def decompositions(keep_layer_norm: bool = False) -> dict[Any, Callable[..., Any]]:
    """The decomposition table AOTAutograd applies (built once; a few ms, as AOTAutograd
    has already loaded torch's decompositions). ``keep_layer_norm``: without
    ``aten.native_layer_norm``, which :func:`expand_layer_norms` decomposes after
    AOTAutograd (:mod:`simaccel.layer_norm`)."""
    table = dict(core_aten_decomposition_table())
    table.update(decompositions_for(_EXTRA_DECOMPS))
    table.update(ATTENTION_DECOMPOSITIONS)  # torch's own returns a wrong logsumexp
    for op in (aten.var_mean.correction, aten.std.correction):
        table.pop(op, None)  # lowered directly (two-pass, float64 accumulation)
    if keep_layer_norm:
        table.pop(aten.native_layer_norm.default)
    return table


_GRAPH_IDS = itertools.count()


def tier0_enabled(options: Options) -> bool | str:
    """The ``tier0`` option, or by default ``SIMACCEL_TIER0`` (on unless "0")."""
    if options.tier0 is not None:
        return options.tier0
    return os.environ.get("SIMACCEL_TIER0", "1").strip() != "0"


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], options: Options,
                  kind: str, facts: list[InputFacts], guard_report: Any = None,
                  size_bounds: dict[str, int] | None = None,
                  version_bumped: frozenset[int] | None = None) -> CompiledGraph:
    """Lower, compile and load one ATen graph onto the device. ``facts``: what compile
    time knows of each input (:mod:`simaccel.input_plan`), by position; ``size_bounds``:
    the bucket upper bound of each size symbol (static-shape mode); ``version_bumped``:
    the inputs whose version AOTAutograd increments before each call
    (:func:`simaccel.guards.dynamo.version_bumped_inputs`; None: not known)."""
    start = time.perf_counter()
    guards_before = dynamo.shape_guard_count()
    device = get_device()
    config = device.config
    name = f"graph{next(_GRAPH_IDS)}_{kind}"
    timer = PhaseTimer()
    with timer.phase("decompose"):  # layer norms AOTAutograd kept whole (decompositions)
        expand_layer_norms(gm)
    if has_data_dependent_sizes(gm):
        return compile_staged(
            gm, facts, lambda stage, inputs, stage_facts: compile_graph(
                stage, inputs, options, kind, stage_facts, guard_report, size_bounds),
            name, options.fallback)
    # AOTAutograd calls us under its FakeTensorMode; graph constants are real tensors.
    with unset_fake_temporarily():
        with timer.phase("lower"):
            lowered = GraphLowering(gm, options.fallback,
                                    bank_dtypes(facts)).run(list(example_inputs))
        with timer.phase("plan inputs"):
            inputs = plan_inputs(lowered, facts, example_inputs, config.alignment,
                                 config.host_map_min_bytes, version_bumped is not None)
        assemble_start = time.perf_counter()
        result = assemble(lowered, inputs, device, name, size_bounds, tier0_enabled(options))
        kernels_ms = sum(k.compile_ms for k in result.kernels) + result.pool_ms
        timer.add("kernels", kernels_ms)
        timer.add("assemble", (time.perf_counter() - assemble_start) * 1e3 - kernels_ms)
    with timer.phase("load"):
        program = Program(device, result.spec)
    device.count("graphs_compiled")
    plan = program.plan
    report = CompileReport(
        graph=name, kernels=result.kernels, host_fallbacks=list(lowered.fallbacks),
        memory_plan={"planned_bytes": plan.total_bytes,
                     "lower_bound_bytes": plan.lower_bound_bytes,
                     "naive_bytes": plan.naive_bytes},
        guards=guard_report, compile_ms=(time.perf_counter() - start) * 1e3,
        phases_ms=timer.ms,
        ops=sum(1 for n in gm.graph.nodes if n.op == "call_function"),
        host_mapped=[(index, buf, program.traced_bytes(buf))
                     for index, buf in sorted(program.host_mapped.items())],
        host_mapped_outputs=[(k, out.buffer, program.traced_bytes(out.buffer))
                             for k, out in enumerate(result.spec.outputs)
                             if out is not None and out.mapped],
        size_symbols=[src.symbol for src in result.spec.symbols],
        size_guards=dynamo.shape_guards_since(guards_before))
    add_report(report)
    log.debug("%s", report)
    static = frozenset(i for i, fact in enumerate(facts) if fact.resident)
    return CompiledGraph(program, lowered.output_meta, graph_outputs(gm, lowered.input_views),
                         report=report, static_inputs=static, version_bumped=version_bumped,
                         tensor_sizes_vary=any(map(_sizes_vary, example_inputs)))


def _sizes_vary(value: Any) -> bool:
    """Whether ``value`` (an example input) is a tensor with a symbolic size or stride:
    a size symbol of the graph, which a lifted int may be alone (an int argument is where
    the program reads a symbol both carry, so its sources do not tell)."""
    return isinstance(value, torch.Tensor) and any(
        map(is_symbolic, (*value.shape, *value.stride())))


@errors_reach_user
def simaccel_backend(gm: torch.fx.GraphModule, example_inputs: list[Any],
                     options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The torch.compile backend (a Dynamo ``CompilerFn``); its SimAccelErrors reach the
    user unwrapped (:mod:`simaccel.guards.dynamo.errors`)."""
    opts = parse_options(options)
    guard_report = _prepare_guards(gm, example_inputs, opts)
    drop_inactive_dropouts(gm)  # eager returns their input: no node for AOTAutograd
    rewrites = fuse_softmax_attention(gm)  # after the dropouts: they sit in the pattern
    bounds = bucket_guards(gm, example_inputs, opts.shape_buckets) if opts.shape_buckets \
        else {}
    gm, seeded_dropouts = seed_active_dropouts(gm)
    if seeded_dropouts:  # the call's seed: a last input Dynamo does not pass (see seeded)
        example_inputs = [*example_inputs, SEED_EXAMPLE]
        rewrites += seeded_dropouts
    frame_facts = frame_input_facts(guard_report.device_plan, len(example_inputs))
    #: the forward graph and its input facts, for the backward graph AOTAutograd compiles next
    forward_seen: list[tuple[torch.fx.GraphModule, list[InputFacts]]] = []
    #: a training graph's compiled forward and how to call it without AOTAutograd's
    #: runtime wrapper (a TrainingSpec), or why not (str)
    training: list[tuple[CompiledGraph, dynamo.TrainingSpec | str]] = []
    #: the call that takes the direct way once the backward is compiled
    training_call: list[dynamo.TrainingCall] = []

    ddp = ddp_note()

    def compile_forward(graph: torch.fx.GraphModule, inputs: list[Any],
                        version_bumped: frozenset[int] | None,
                        training: bool = False) -> CompiledGraph:
        facts = forward_input_facts(frame_facts, gm, graph)
        if training:
            facts = training_facts(facts)
        forward_seen.append((graph, facts))
        return _noted(compile_graph(graph, inputs, opts, "forward", facts, guard_report,
                                    bounds, version_bumped), ddp, rewrites)

    def fw_compiler(graph: torch.fx.GraphModule, inputs: list[Any]) -> CompiledGraph:
        compiled = compile_forward(graph, inputs, dynamo.version_bumped_inputs(graph), True)
        training.append((compiled, dynamo.training_spec(gm, graph, len(example_inputs),
                                                        autocast)))
        return compiled

    def bw_compiler(graph: torch.fx.GraphModule, inputs: list[Any]) -> CompiledGraph:
        forward, fw_facts = forward_seen[-1]
        facts = backward_input_facts(fw_facts, forward, graph, get_device().config.alignment)
        compiled = _noted(compile_graph(graph, inputs, opts, "backward", facts, guard_report,
                                        bounds), ddp)
        if training_call:
            training_call[-1].backward_compiled(compiled, graph, forward)
        return compiled

    inference: list[tuple[CompiledGraph, dynamo.DirectCall | str]] = []
    autocast = any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda"))

    def inference_compiler(graph: torch.fx.GraphModule, inputs: list[Any]) -> CompiledGraph:
        compiled = compile_forward(graph, inputs, dynamo.version_bumped_inputs(graph))
        inference.append((compiled, direct_call(gm, graph, len(example_inputs), autocast)))
        return compiled

    table = decompositions(defers_layer_norm(gm, example_inputs))
    # a graph traced once mutates no input: no version to bump
    once = dynamo.compile_inference_once(
        gm, example_inputs, table,
        functools.partial(compile_forward, version_bumped=frozenset()), autocast)
    if not isinstance(once, str):
        called = _call_path(gm, None, [(once, dynamo.DirectCall())], TRACED_ONCE)
    else:
        forward = aot_module_simplified(gm, example_inputs, fw_compiler=fw_compiler,
                                        bw_compiler=bw_compiler,
                                        inference_compiler=inference_compiler,
                                        decompositions=table)
        called = _call_path(gm, forward, inference, f"AOTAutograd ({once})")
        if training:
            called = _training_path(forward, *training[-1])
            if isinstance(called, dynamo.TrainingCall):
                training_call.append(called)
    return seeded(called) if seeded_dropouts else called


def _training_path(forward: Callable[..., Any], compiled: CompiledGraph,
                   spec: dynamo.TrainingSpec | str) -> Callable[..., Any]:
    """What Dynamo calls for a training graph: AOTAutograd's runtime wrapper, or, where
    the graph needs none of it, a :class:`~simaccel.guards.dynamo.TrainingCall` (the
    wrapper until the backward is compiled). The choice goes in the forward's report."""
    if isinstance(spec, str):
        path, called = f"AOTAutograd runtime wrapper ({spec})", forward
    else:
        path = "direct training call (an autograd.Function of simaccel's own, no " \
               "AOTAutograd runtime wrapper, from the call after the backward compiled)"
        called = dynamo.TrainingCall(forward, compiled, spec)
    if compiled.report is not None:
        compiled.report.call_path = path
    return called


def ddp_note() -> str:
    """What a compile under DistributedDataParallel reports: the DDPOptimizer split it
    is, and whether the DDP module's gradient buckets go through the device's DMA engine
    (attached here: :mod:`simaccel.distributed`). "" outside DDP."""
    from simaccel.distributed import attach_active
    split = dynamo.ddp_split_index()
    parts = [f"DDPOptimizer split {split}"] if split is not None else []
    attached = attach_active()
    return "; ".join(parts + ([attached] if attached else []))


def _noted(compiled: Any, ddp: str, rewrites: list[str] | None = None) -> Any:
    """``compiled`` with its report noting the DDP split and the rewrites of the frame's
    graph (:mod:`simaccel.attention_rewrite`) that reached it."""
    report = getattr(compiled, "report", None)
    if report is not None and ddp:
        report.ddp = ddp
    if report is not None and rewrites:
        report.rewrites = list(rewrites)
    return compiled


#: how an inference graph that AOTAutograd would trace twice for nothing reached ATen
TRACED_ONCE = "traced once (no AOTAutograd metadata pass or functionalization needed)"


def _call_path(gm: torch.fx.GraphModule, forward: Callable[..., Any] | None,
               inference: list[tuple[CompiledGraph, dynamo.DirectCall | str]],
               capture: str) -> Callable[..., Any]:
    """What Dynamo calls: an inference graph that needs none of AOTAutograd's runtime
    wrapper is called directly (~8-15 us a call less), and its lifted floats come as
    Python numbers rather than 0-d tensors (~3 us each); anything else through the
    wrapper (``forward``). The choice, and how the graph reached ATen (``capture``), are
    recorded in the graph's compile report."""
    if len(inference) != 1:  # a training graph: AOTAutograd's autograd.Function runs it
        return forward
    compiled, direct = inference[0]
    if compiled.report is not None:
        compiled.report.capture = capture
    if isinstance(direct, str):
        path, called = f"AOTAutograd runtime wrapper ({direct})", forward
    else:
        held = len(direct.held)
        unwrapped = dynamo.pass_scalars_unwrapped(
            gm, [i - held for i in compiled.bank_inputs if i >= held])
        notes = [f"{held} module-held tensor(s) passed first"] if held else []
        notes += [f"{len(direct.bumped)} mutated input(s) version-bumped"] \
            if direct.bumped else []
        notes += [f"{len(unwrapped)} lifted scalar(s) passed as Python numbers"] \
            if unwrapped else []
        path = "direct (inference graph, no AOTAutograd runtime wrapper needed" + \
            "".join(f"; {note}" for note in notes) + ")"
        called = direct_caller(compiled, direct.held, direct.bumped)
    if compiled.report is not None:
        compiled.report.call_path = path
    return called


def _prepare_guards(gm: torch.fx.GraphModule, example_inputs: list[Any], opts: Options) -> Any:
    """Scalar lifting and backend guards (see :mod:`simaccel.guards`). On a frame's first
    trace this raises Dynamo's restart exception: Dynamo re-traces the frame at once.
    The report's ``device_plan`` holds the per-input facts the device guards pin
    (:func:`simaccel.input_plan.frame_input_facts` reads them)."""
    return prepare_frame(gm, example_inputs, opts, device=get_device())


# Floats of the frames this backend compiles are graph inputs from their first trace
# (no lifting re-trace for them; :mod:`simaccel.guards.first_trace`).
first_trace.install(simaccel_backend)

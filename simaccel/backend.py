"""The ``simaccel`` torch.compile backend: guards -> AOTAutograd -> codegen -> runtime.

Registered under the ``torch_dynamo_backends`` entry point, so
``torch.compile(model, backend="simaccel")`` works without importing simaccel.
"""
from __future__ import annotations

import functools
import itertools
import logging
import time
from typing import Any, Callable

import torch
import torch.fx
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._functorch.aot_autograd import aot_module_simplified
from torch._subclasses.fake_tensor import unset_fake_temporarily

from simaccel.codegen.compile import assemble
from simaccel.compiled import CompiledGraph, scalar_outputs
from simaccel.codegen.graph import GraphLowering
from simaccel.device_plan import DevicePlan, plan_for_graph, plan_from_guarded_facts
from simaccel.guards import prepare_frame
from simaccel.guards.dynamo import runtime_wrapper_needed
from simaccel.options import Options, parse_options
from simaccel.report import CompileReport, add_report
from simaccel.runtime.device import get_device
from simaccel.runtime.program import Program

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
    aten._scaled_dot_product_flash_attention_for_cpu, aten.hardtanh, aten.leaky_relu,
    aten.mse_loss, aten.mse_loss_backward, aten.nll_loss_forward, aten.nll_loss_backward,
    aten.addcmul, aten.addcdiv, aten.logit, aten.hardswish, aten.hardsigmoid, aten.elu,
    aten.softplus, aten.std, aten.var_mean, aten.linalg_vector_norm, aten.norm,
    aten.native_group_norm, aten.native_group_norm_backward,
]


@functools.lru_cache(maxsize=1)
def decompositions() -> dict[Any, Callable[..., Any]]:
    """The decomposition table AOTAutograd applies (built once; a few ms, as AOTAutograd
    has already loaded torch's decompositions)."""
    table = dict(_core_aten_table())
    table.update(get_decompositions(_EXTRA_DECOMPS))
    for op in (aten.var_mean.correction, aten.std.correction):
        table.pop(op, None)  # lowered directly (two-pass, float64 accumulation)
    return table


def _core_aten_table() -> dict[Any, Callable[..., Any]]:
    """The ATen part of ``core_aten_decompositions()``. That table also lists every
    CompositeImplicitAutograd op (for torch.export), and finding them walks all of ATen
    (~50 ms of a warm compile); AOTAutograd decomposes those ops by dispatch anyway."""
    try:
        from torch._decomp import _core_aten_decompositions_post_autograd
    except ImportError:  # pragma: no cover - other torch versions
        return dict(core_aten_decompositions())
    return _core_aten_decompositions_post_autograd()


_GRAPH_IDS = itertools.count()


def _c_contiguous(value: Any) -> bool:
    """True for a tensor laid out in C order with static sizes and strides (strides of
    size-1 dims do not count, as for numpy's flag); Dynamo's tensor guard pins them."""
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return False
    if not all(type(v) is int for v in (*value.shape, *value.stride())):
        return False  # symbolic: not known for every call (and asking would add a guard)
    return value.is_contiguous()


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], options: Options,
                  kind: str, guard_report: Any = None,
                  device_plan: DevicePlan | None = None) -> CompiledGraph:
    """Lower, compile and load one ATen graph onto the device. ``plan``: the frame's
    alignment, slot-width and parameter facts, indexed by this graph's inputs
    (forward only)."""
    start = time.perf_counter()
    device = get_device()
    name = f"graph{next(_GRAPH_IDS)}_{kind}"
    # AOTAutograd calls us under its FakeTensorMode; graph constants are real tensors.
    with unset_fake_temporarily():
        scalar_dtypes = device_plan.int_dtypes if device_plan is not None else {}
        lowered = GraphLowering(gm, options.fallback, scalar_dtypes).run(list(example_inputs))
        result = assemble(lowered, device, name)
    if device_plan is not None:
        result.spec.aligned_inputs = dict(device_plan.aligned)
    result.spec.contiguous_inputs = frozenset(
        i for i, _ in result.spec.tensor_inputs if _c_contiguous(example_inputs[i]))
    program = Program(device, result.spec)
    if device_plan is not None:
        program.set_resident_inputs(device_plan.resident)
    device.count("graphs_compiled")
    plan = program.plan
    report = CompileReport(
        graph=name, kernels=result.kernels, host_fallbacks=list(lowered.fallbacks),
        memory_plan={"planned_bytes": plan.total_bytes,
                     "lower_bound_bytes": plan.lower_bound_bytes,
                     "naive_bytes": plan.naive_bytes},
        guards=guard_report, compile_ms=(time.perf_counter() - start) * 1e3,
        ops=sum(1 for n in gm.graph.nodes if n.op == "call_function"),
        host_mapped=[(index, buf, result.spec.buffers[buf].nbytes)
                     for index, buf in sorted(program.host_mapped.items())])
    add_report(report)
    log.debug("%s", report)
    return CompiledGraph(program, lowered.output_meta, scalar_outputs(gm),
                         resident=device_plan.resident if device_plan is not None else None,
                         report=report)


def simaccel_backend(gm: torch.fx.GraphModule, example_inputs: list[Any],
                     options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The torch.compile backend (a Dynamo ``CompilerFn``)."""
    opts = parse_options(options)
    guard_report = _prepare_guards(gm, example_inputs, opts)
    frame_plan = plan_from_guarded_facts(guard_report.device_plan, example_inputs)

    def fw_compiler(graph: torch.fx.GraphModule, inputs: list[Any]) -> CompiledGraph:
        plan = plan_for_graph(frame_plan, gm, graph, len(example_inputs))
        return compile_graph(graph, inputs, opts, "forward", guard_report, plan)

    def bw_compiler(graph: torch.fx.GraphModule, inputs: list[Any]) -> CompiledGraph:
        return compile_graph(graph, inputs, opts, "backward", guard_report)

    inference: list[tuple[CompiledGraph, str | None]] = []
    autocast = any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda"))

    def inference_compiler(graph: torch.fx.GraphModule, inputs: list[Any]) -> CompiledGraph:
        compiled = fw_compiler(graph, inputs)
        inference.append((compiled, runtime_wrapper_needed(gm, graph, len(example_inputs),
                                                           autocast)))
        return compiled

    forward = aot_module_simplified(gm, example_inputs, fw_compiler=fw_compiler,
                                    bw_compiler=bw_compiler,
                                    inference_compiler=inference_compiler,
                                    decompositions=decompositions())
    return _call_path(forward, inference)


def _call_path(forward: Callable[..., Any],
               inference: list[tuple[CompiledGraph, str | None]]) -> Callable[..., Any]:
    """What Dynamo calls: an inference graph that needs none of AOTAutograd's runtime
    wrapper is called directly (~8 us a call less); anything else through the wrapper.
    The choice is recorded in the graph's compile report."""
    if len(inference) != 1:  # a training graph: AOTAutograd's autograd.Function runs it
        return forward
    compiled, why = inference[0]
    if compiled.report is not None:
        compiled.report.call_path = ("direct (inference graph, no AOTAutograd runtime "
                                     "wrapper needed)" if why is None
                                     else f"AOTAutograd runtime wrapper ({why})")
    return forward if why is not None else compiled.call_unboxed


def _prepare_guards(gm: torch.fx.GraphModule, example_inputs: list[Any], opts: Options) -> Any:
    """Scalar lifting and backend guards (see :mod:`simaccel.guards`). On a frame's first
    trace this raises Dynamo's restart exception: Dynamo re-traces the frame at once.
    The report's ``device_plan`` holds the per-input facts the device guards pin."""
    return prepare_frame(gm, example_inputs, opts, device=get_device())

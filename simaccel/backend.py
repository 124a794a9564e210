"""The ``simaccel`` torch.compile backend: guards -> AOTAutograd -> codegen -> runtime.

Registered under the ``torch_dynamo_backends`` entry point, so
``torch.compile(model, backend="simaccel")`` works without importing simaccel.
"""
from __future__ import annotations

import itertools
import logging
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.fx
import torch.nn as nn
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._functorch.aot_autograd import aot_module_simplified
from torch._subclasses.fake_tensor import unset_fake_temporarily

from simaccel.codegen.compile import STORAGE_DTYPES, assemble
from simaccel.codegen.graph import GraphLowering
from simaccel.guards import prepare_frame
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
]


def decompositions() -> dict[Any, Callable[..., Any]]:
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(_EXTRA_DECOMPS))
    for op in (aten.var_mean.correction, aten.std.correction):
        table.pop(op, None)  # lowered directly (two-pass, float64 accumulation)
    return table


_GRAPH_IDS = itertools.count()


class CompiledGraph:
    """The callable AOTAutograd runs for one forward or backward graph (boxed calling
    convention: it receives the argument list and clears it)."""

    _boxed_call = True

    def __init__(self, program: Program, output_meta: list[Any], scalar_outputs: dict[int, Any]):
        self.program = program
        self.output_meta = output_meta
        self.scalar_outputs = scalar_outputs
        self.resident: set[int] | None = None

    def __call__(self, args: list[Any]) -> list[Any]:
        if self.resident is None:
            # Parameters and buffers stay on the device between calls.
            self.resident = {i for i, a in enumerate(args) if isinstance(a, nn.Parameter)
                             or getattr(a, "_is_param", False)}
            self.program.set_resident_inputs(self.resident)
        keys = {i: _content_key(args[i]) for i in self.resident}
        host_args = [_host_array(a) for a in args]
        outputs = [_empty_like_meta(m) for m in self.output_meta]
        self.program.run(host_args, [_numpy_view(o) for o in outputs], keys)
        for index, value in self.scalar_outputs.items():
            outputs[index] = value(args) if callable(value) else value
        args.clear()
        return outputs


def _content_key(t: torch.Tensor) -> tuple:
    """Identifies a tensor's current contents: the same object, storage and version
    counter means the device copy is still valid (an in-place update bumps the version)."""
    return (id(t), t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()))


def _host_array(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            raise TypeError(f"simaccel takes CPU tensors as host inputs, got {t.device}")
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        if str(t.dtype).replace("torch.", "") in STORAGE_DTYPES:
            t = t.view(torch.int16)
        return t.numpy()
    return value


def _empty_like_meta(meta: Any) -> Any:
    if not isinstance(meta, torch.Tensor):
        return None
    shape = [int(s) for s in meta.shape]
    try:
        stride = [int(s) for s in meta.stride()]
        if _dense_strides(shape, stride):
            return torch.empty_strided(shape, stride, dtype=meta.dtype)
    except Exception:  # strides unavailable (e.g. symbolic): contiguous is always valid
        pass
    return torch.empty(shape, dtype=meta.dtype)


def _dense_strides(shape: list[int], stride: list[int]) -> bool:
    """True if (shape, stride) covers exactly prod(shape) elements without overlap."""
    dims = sorted((s, n) for s, n in zip(stride, shape) if n != 1)
    expected = 1
    for s, n in dims:
        if s != expected:
            return False
        expected *= n
    return True


def _numpy_view(t: Any) -> np.ndarray | None:
    if t is None:
        return None
    if str(t.dtype).replace("torch.", "") in STORAGE_DTYPES:
        return t.view(torch.int16).numpy()
    return t.numpy()


def _scalar_outputs(gm: torch.fx.GraphModule, lowered: Any) -> dict[int, Any]:
    """Outputs that are Python values (ints, SymInts, None), not tensors."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    result: dict[int, Any] = {}
    for index, node in enumerate(flat):
        meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else node
        if isinstance(meta, torch.Tensor):
            continue
        if isinstance(node, torch.fx.Node) and node in placeholders:
            pos = placeholders.index(node)
            result[index] = lambda args, pos=pos: args[pos]
        elif isinstance(meta, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            result[index] = _concrete(meta)
        else:
            result[index] = meta
    return result


def _concrete(value: Any) -> Any:
    node = getattr(value, "node", None)
    if node is not None and hasattr(node, "hint") and node.hint is not None:
        return node.hint
    return value


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any], options: Options,
                  kind: str, guard_report: Any = None) -> CompiledGraph:
    """Lower, compile and load one ATen graph onto the device."""
    start = time.perf_counter()
    device = get_device()
    name = f"graph{next(_GRAPH_IDS)}_{kind}"
    # AOTAutograd calls us under its FakeTensorMode; graph constants are real tensors.
    with unset_fake_temporarily():
        lowered = GraphLowering(gm, options.fallback).run(list(example_inputs))
        result = assemble(lowered, device, name)
    program = Program(device, result.spec)
    device.count("graphs_compiled")
    plan = program.plan
    report = CompileReport(
        graph=name, kernels=result.kernels, host_fallbacks=list(lowered.fallbacks),
        memory_plan={"planned_bytes": plan.total_bytes,
                     "lower_bound_bytes": plan.lower_bound_bytes,
                     "naive_bytes": plan.naive_bytes},
        guards=guard_report, compile_ms=(time.perf_counter() - start) * 1e3,
        ops=sum(1 for n in gm.graph.nodes if n.op == "call_function"))
    add_report(report)
    log.debug("%s", report)
    return CompiledGraph(program, lowered.output_meta, _scalar_outputs(gm, lowered))


def simaccel_backend(gm: torch.fx.GraphModule, example_inputs: list[Any],
                     options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The torch.compile backend (a Dynamo ``CompilerFn``)."""
    opts = parse_options(options)
    guard_report = _prepare_guards(gm, example_inputs, opts)

    def fw_compiler(graph: torch.fx.GraphModule, inputs: list[Any]) -> CompiledGraph:
        return compile_graph(graph, inputs, opts, "forward", guard_report)

    def bw_compiler(graph: torch.fx.GraphModule, inputs: list[Any]) -> CompiledGraph:
        return compile_graph(graph, inputs, opts, "backward", guard_report)

    return aot_module_simplified(gm, example_inputs, fw_compiler=fw_compiler,
                                 bw_compiler=bw_compiler, decompositions=decompositions())


def _prepare_guards(gm: torch.fx.GraphModule, example_inputs: list[Any], opts: Options) -> Any:
    """Scalar lifting and backend guards (see :mod:`simaccel.guards`). On a frame's first
    trace this raises Dynamo's restart exception: Dynamo re-traces the frame at once."""
    return prepare_frame(gm, example_inputs, opts)

"""The one place in simaccel that reaches into torch's private modules.

``torch._dynamo``, ``torch._guards``, ``torch._functorch``, ``torch._decomp``,
``torch._subclasses`` and ``torch._logging`` are used here and nowhere else; callers use
the names below (``from simaccel.guards import dynamo; dynamo.value_guard_sites()``). Most
of it runs *inside* a backend's CompilerFn, while Dynamo compiles a frame.

Modules, by concern:

* :mod:`.version`: the supported torch and the private names relied on (checked loudly).
* :mod:`.frame`: the frame being compiled: sources, their values, graph inputs, value
  guards; per-trace objects (:class:`~.frame.SlotsPerTrace`).
* :mod:`.guard_text`: the frame's guards and shape-env predicates as readable text.
* :mod:`.retrace`: the re-trace request, config patching, frame-state seeding and the
  end-of-compile undo (:class:`~.retrace.RetracesPerCompile`).
* :mod:`.lifted`: what the re-traced graph made of the requested scalars.
* :mod:`.unliftable`: sources a frame cannot lift, per code object for the process
  (:class:`~.unliftable.UnliftablePerCode`) and on disk; the values each compile saw.
* :mod:`.first_trace`: floats made graph inputs on a frame's first trace (a hook on
  Dynamo's frame-state lookup), per compile (:class:`~.first_trace.FirstTraceFloats`).
* :mod:`.failures`: a failed lifting re-trace is traced again with its scalars
  specialized (a hook on Dynamo's root tracer); where a trace's graph ended.
* :mod:`.tensorify`: AOTAutograd's tensorify pass keeps the scalar arguments simaccel
  lowers itself symbolic.
* :mod:`.install`: installing guards: lambda guards, frame expressions, the folded
  SIMACCEL_SHAPE_ENV check, SymInt range guards.
* :mod:`.values`: module-state tensors, size hints, leaving fake-tensor mode.
* :mod:`.aot`: AOTAutograd: its entry point, decomposition tables, whether its runtime
  wrapper is needed, what a backward graph's inputs are in the forward graph.
* :mod:`.single_trace`: an inference graph AOTAutograd would trace twice for nothing is
  traced to ATen once.
* :mod:`.training`: a training graph without mutations, aliases or symbolic sizes is
  called in an ``autograd.Function`` of its own, without AOTAutograd's runtime wrapper.
* :mod:`.rawargs`: lifted scalars reach a directly called graph as Python numbers.
* :mod:`.megacache`: simaccel's artifact type in torch's Mega-Cache.
* :mod:`.ddp`: the DDP module whose forward is compiling, the DDPOptimizer split index.
* :mod:`.shapes`: the guards size decisions add to the frame's shape env.
* :mod:`.logs`: the ``simaccel`` log in torch's logging system.
* :mod:`.errors`: simaccel's errors reach the user unwrapped (not in
  ``BackendCompilerFailed``).

Lifetimes of the state kept here: a re-trace request lives for one compile of a frame, a
trace slot for one trace (OutputGraph), an unliftable source for the process (until
``torch._dynamo.reset()``).
"""
from simaccel.guards.dynamo.aot import (
    aot_module_simplified, backend_placeholder, backward_input_origins,
    core_aten_decomposition_table,
    decompositions_for, frame_compile_seconds, frame_graph_copy, DirectCall, direct_call,
    version_bumped_inputs,
)
from simaccel.guards.dynamo.frame import (
    VALUE_GUARDS, current_compile_id, eval_frame_expression, frame_slot, frame_value,
    graph_inputs, in_resume_frame, resolve_source, value_guard_sites,
)
from simaccel.guards.dynamo.ddp import active_ddp_module, ddp_split_index
from simaccel.guards.dynamo import megacache
from simaccel.guards.dynamo.errors import errors_reach_user
from simaccel.guards.dynamo.failures import graph_end, involved_sources
from simaccel.guards.dynamo.first_trace import first_trace_floats, install_first_trace_lifting
from simaccel.guards.dynamo.guard_text import readable_guards, symbol_predicates
from simaccel.guards.dynamo.install import (
    SIMACCEL_GUARD, SIMACCEL_SHAPE_ENV, guard_symint_range, install_frame_expression,
    install_lambda_guard,
)
from simaccel.guards.dynamo.lifted import inspect_lifted, scalar_inputs
from simaccel.guards.dynamo.logs import register_torch_logs
from simaccel.guards.dynamo.rawargs import pass_scalars_unwrapped
from simaccel.guards.dynamo.retrace import pending_retrace, request_retrace, restart_trace
from simaccel.guards.dynamo.single_trace import compile_inference_once
from simaccel.guards.dynamo.training import TrainingCall, TrainingSpec, training_spec
from simaccel.guards.dynamo.shapes import shape_guard_count, shape_guards_since
from simaccel.guards.dynamo.unliftable import changed_sources, remember_unliftable, unliftable
from simaccel.guards.dynamo.values import (
    fake_mode_of, fake_value, has_static_address, is_module_state, size_hint,
    unset_fake_temporarily,
)
from simaccel.guards.dynamo.version import SUPPORTED_TORCH_VERSION, assert_supported_torch

__all__ = [
    "SIMACCEL_GUARD", "SIMACCEL_SHAPE_ENV", "SUPPORTED_TORCH_VERSION", "VALUE_GUARDS",
    "active_ddp_module", "aot_module_simplified", "backend_placeholder", "compile_inference_once", "frame_compile_seconds", "frame_graph_copy", "assert_supported_torch", "backward_input_origins",
    "changed_sources", "core_aten_decomposition_table",
    "current_compile_id", "fake_mode_of", "fake_value", "ddp_split_index", "decompositions_for", "errors_reach_user", "eval_frame_expression", "frame_slot",
    "first_trace_floats", "frame_value", "graph_end", "graph_inputs", "guard_symint_range", "involved_sources", "has_static_address",
    "in_resume_frame", "inspect_lifted", "install_first_trace_lifting", "install_frame_expression", "install_lambda_guard",
    "is_module_state", "megacache", "pass_scalars_unwrapped", "pending_retrace", "readable_guards", "register_torch_logs",
    "remember_unliftable", "request_retrace", "restart_trace", "resolve_source", "DirectCall", "direct_call", "version_bumped_inputs",
    "scalar_inputs", "shape_guard_count", "shape_guards_since", "size_hint", "symbol_predicates", "unliftable", "unset_fake_temporarily",
    "value_guard_sites", "TrainingCall", "TrainingSpec", "training_spec",
]

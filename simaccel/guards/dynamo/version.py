"""The torch this package was written against, and a loud check that it is the one running.

Every private torch name the package uses is listed in :data:`REQUIRED_INTERNALS`;
:func:`assert_supported_torch` checks the version and that each name still exists, so a
torch upgrade fails with a message naming what changed instead of misbehaving later.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import torch

from simaccel.errors import SimAccelError

SUPPORTED_TORCH_VERSION = "2.13.0"

#: (module, attribute path) pairs the package relies on
REQUIRED_INTERNALS: tuple[tuple[str, str], ...] = (
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
    ("torch._dynamo.variables.builder", "process_automatic_dynamic"),
    ("torch._dynamo.variables.builder", "VariableBuilder.wrap_symfloat"),
    ("torch._subclasses.fake_tensor", "FakeTensor"),
    ("torch._dynamo.config", "automatic_dynamic_shapes"),
    ("torch._dynamo.config", "specialize_float"),
    ("torch._guards", "CompileContext.current_compile_id"),
    ("torch.compiler.config", "dynamic_sources"),
    ("torch._guards", "Guard"),
    ("torch._guards", "GuardsSet.add"),
    ("torch._guards", "SLoc"),
    ("torch._dynamo.guards", "get_verbose_code_parts"),
    ("torch._dynamo.guards", "GuardBuilder.get_guard_manager"),
    ("torch._dynamo.source", "GlobalStateSource"),
    ("torch._dynamo.source", "TensorPropertySource"),
    ("torch._dynamo.resume_execution", "TORCH_DYNAMO_RESUME_IN_PREFIX"),
    ("torch._dynamo.guards", "GuardBuilder.SHAPE_ENV"),
    ("torch._dynamo.guards", "GuardBuilder.add_python_lambda_leaf_guard_to_root"),
    ("torch._dynamo.guards", "PyExprCSEPass"),
    ("torch._guards", "GuardsSet.track_guard_by_source"),
    ("torch.fx.experimental.symbolic_shapes", "ValueRangesSLoc"),
    ("torch.utils._sympy.symbol", "symbol_is_type"),
    ("torch.utils._sympy.symbol", "SymT.FLOAT"),
    ("torch._dynamo.utils", "GmWrapper"),
    ("torch._functorch._aot_autograd.schemas", "OutputType.non_alias"),
    ("torch._functorch._aot_autograd.schemas", "SubclassCreationMeta"),
    ("torch._functorch._aot_autograd.schemas", "ViewAndMutationMeta"),
    ("torch._functorch._aot_autograd.schemas", "MutationType.MUTATED_IN_GRAPH"),
    ("torch._functorch._aot_autograd.schemas", "InputAliasInfo.mutation_type"),
    ("torch._guards", "TracingContext.try_get"),
    ("torch._guards", "detect_fake_mode"),
    ("torch._functorch._aot_autograd.schemas", "ViewAndMutationMeta"),
    ("torch._decomp", "_core_aten_decompositions_post_autograd"),
    ("torch._logging._internal", "register_log"),
    ("torch._dynamo.symbolic_convert", "InstructionTranslator.run"),
    ("torch._dynamo.symbolic_convert", "TensorifyState.force_specializations"),
    ("torch._dynamo.exc", "RestartAnalysis"),
    ("torch._dynamo.exc", "SkipFrame"),
    ("torch._dynamo.variables", "SymNodeVariable"),
    ("torch._functorch._aot_autograd.graph_compile", "tensorify_python_scalars"),
    ("torch.fx.passes._tensorify_python_scalars", "SUPPORTED_OPS"),
    ("torch._functorch.aot_autograd", "aot_module_simplified"),
    ("torch.nn.parallel", "DistributedDataParallel._get_active_ddp_module"),
    ("torch._dynamo.backends.distributed", "DDPOptimizerContext"),
    ("torch._dynamo.utils", "counters"),
    ("torch._dynamo.utils", "compilation_time_metrics"),
    ("torch.compiler._cache", "CacheArtifactFactory._artifact_types"),
    ("torch.compiler._cache", "CacheArtifactManager.record_artifact"),
    # single_trace.py
    ("torch._dynamo.utils", "dynamo_timed"),
    ("torch._dynamo.utils", "preserve_rng_state"),
    ("torch.fx.experimental.proxy_tensor", "enable_python_dispatcher"),
    ("torch.multiprocessing.reductions", "StorageWeakRef"),
)

#: the fields of AOTAutograd's graph metadata :func:`.aot.direct_call` reads
AOT_META_FIELDS = frozenset({"input_info", "output_info", "num_intermediate_bases", "tokens",
                             "subclass_inp_meta"})

#: the fields of Dynamo's GraphArg :mod:`.rawargs` reads and sets
GRAPHARG_FIELDS = frozenset({"pass_arg_as_tensor", "is_tensor", "fake_tensor"})


def assert_supported_torch() -> None:
    """Fail loudly if this torch is not the one whose internals this package was written for.

    Raises :class:`SimAccelError` naming the version or the missing attribute.
    """
    version = torch.__version__.split("+")[0]
    if version != SUPPORTED_TORCH_VERSION:
        raise SimAccelError(
            f"simaccel.guards.dynamo supports torch {SUPPORTED_TORCH_VERSION}, found "
            f"{torch.__version__}; Dynamo internals used for scalar lifting may have changed. "
            f"Use options={{'lift': 'off'}} or update simaccel/guards/dynamo/.")
    for module_name, path in REQUIRED_INTERNALS:
        _resolve(module_name, path)
    _check_record_fields()


def _resolve(module_name: str, path: str) -> Any:
    obj: Any = importlib.import_module(module_name)
    for part in path.split("."):
        if not hasattr(obj, part):
            raise SimAccelError(
                f"torch internals changed: {module_name}.{path} is missing; "
                f"simaccel.guards.dynamo must be updated (or use options={{'lift': 'off'}})")
        obj = getattr(obj, part)
    return obj


def _check_record_fields() -> None:
    """The fields of Dynamo's and AOTAutograd's dataclasses the package reads or builds."""
    from torch._dynamo import pgo
    from torch._dynamo.exc import RestartAnalysis, TensorifyScalarRestartAnalysis
    from torch._functorch._aot_autograd.schemas import ViewAndMutationMeta
    from torch._dynamo.variables.builder import GraphArg
    missing_arg = GRAPHARG_FIELDS - {f.name for f in dataclasses.fields(GraphArg)}
    if missing_arg:
        raise SimAccelError(f"torch internals changed: GraphArg has no {missing_arg}")
    if "scalar" not in {f.name for f in dataclasses.fields(pgo.FrameStateSizeEntry)}:
        raise SimAccelError("torch internals changed: FrameStateSizeEntry has no 'scalar'")
    missing = AOT_META_FIELDS - {f.name for f in dataclasses.fields(ViewAndMutationMeta)}
    if missing:
        raise SimAccelError(f"torch internals changed: ViewAndMutationMeta has no {missing}")
    if not issubclass(TensorifyScalarRestartAnalysis, RestartAnalysis):
        raise SimAccelError("torch internals changed: TensorifyScalarRestartAnalysis is no "
                            "longer a RestartAnalysis")

"""simaccel.guards.dynamo: loud failure when torch internals change, bounded re-traces,
config restored after every compile, warnings instead of silent fallbacks."""
from __future__ import annotations

import logging

import pytest
import torch

from conftest import LiftingBackend, unique_graphs
from simaccel.errors import SimAccelError
from simaccel.guards import dynamo
from simaccel.guards.dynamo import LiftOutcome


def test_supported_torch_passes() -> None:
    dynamo.assert_supported_torch()


def test_other_torch_version_fails_loudly(monkeypatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.14.0")
    with pytest.raises(SimAccelError, match="supports torch 2.13.0"):
        dynamo.assert_supported_torch()


@pytest.mark.parametrize("module_name,path", dynamo._REQUIRED_ATTRS)
def test_required_internals_exist(module_name: str, path: str) -> None:
    import importlib
    obj = importlib.import_module(module_name)
    for part in path.split("."):
        obj = getattr(obj, part)


def test_missing_internal_fails_loudly(monkeypatch) -> None:
    import torch._dynamo.pgo as pgo
    monkeypatch.delattr(pgo, "auto_dynamic")
    with pytest.raises(SimAccelError, match="pgo.auto_dynamic is missing"):
        dynamo.assert_supported_torch()


def test_dynamo_still_routes_the_restart_exception() -> None:
    """The backend-raised restart must pass through _call_user_compiler untouched."""
    import inspect

    from torch._dynamo import output_graph
    source = inspect.getsource(output_graph.OutputGraph._call_user_compiler)
    assert "except (TensorifyScalarRestartAnalysis" in source


def test_dynamic_sources_is_honoured_before_int_specialization() -> None:
    import inspect

    from torch._dynamo.variables import builder
    source = inspect.getsource(builder.VariableBuilder.wrap_literal)
    assert source.index("is_dynamic_source") < source.index("is_int_specialization_case")


def test_outside_a_compile_is_an_error() -> None:
    with pytest.raises(SimAccelError, match="while Dynamo compiles"):
        dynamo.value_guard_sites()


def test_config_is_restored_after_compile() -> None:
    before = (torch.compiler.config.dynamic_sources, torch._dynamo.config.automatic_dynamic_shapes,
              torch._dynamo.config.specialize_float)

    def fn(x, n, alpha):
        return x * n * alpha

    compiled = torch.compile(fn, backend=LiftingBackend(), dynamic=False)
    compiled(torch.ones(3), 2, 0.5)
    after = (torch.compiler.config.dynamic_sources, torch._dynamo.config.automatic_dynamic_shapes,
             torch._dynamo.config.specialize_float)
    assert after == before
    assert dynamo._PENDING == {}


def test_exact_source_regex_survives_dynamic_sources_parsing() -> None:
    from torch._dynamo.variables.builder import _parse_source_entry
    import re
    name = "L['cfg']['learning rate, v:2']"
    pattern, dim = _parse_source_entry(dynamo._exact_source_regex(name).replace(" ", ""))
    assert dim is None and re.match(pattern, name)
    assert not re.match(pattern, name + ".x")


def test_retrace_is_bounded_and_warns(monkeypatch, caplog) -> None:
    """If each re-trace finds another shape use, compile anyway after two, with a warning."""
    def last_one_is_a_shape(gm, sources):
        sources = list(sources)
        return {s: LiftOutcome(s, "shape" if s == sources[-1] else "input") for s in sources}

    monkeypatch.setattr(dynamo, "inspect_lifted", last_one_is_a_shape)
    backend = LiftingBackend()

    def fn(x, alpha, beta):
        return x * alpha + beta

    with caplog.at_level(logging.WARNING, logger="simaccel"):
        compiled = torch.compile(fn, backend=backend, dynamic=False)
        torch.testing.assert_close(compiled(torch.ones(2), 0.5, 2.0), torch.ones(2) * 0.5 + 2)
    assert backend.calls == 3  # first trace + at most two re-traces
    assert unique_graphs() == 1
    assert any("could not be lifted" in r.getMessage() for r in caplog.records)
    assert backend.reports[-1].warnings


def test_unliftable_memory_is_forgotten_on_reset() -> None:
    def fn(x, n):
        return x.view(n, -1)

    for _ in range(2):
        backend = LiftingBackend()
        compiled = torch.compile(fn, backend=backend, dynamic=False)
        compiled(torch.ones(6), 2)
        # A fresh Dynamo (reset) re-learns that n is a shape: first trace asks to lift it.
        assert backend.calls == 3, backend.calls
        assert "L['n']" in backend.reports[-1].kept_sources
        torch._dynamo.reset()

"""simaccel.guards.dynamo: loud failure when torch internals change, bounded re-traces,
config restored after every compile, warnings instead of silent fallbacks."""
from __future__ import annotations

import gc
import logging
import re
from typing import Any

import pytest
import torch

from conftest import LiftingBackend, unique_graphs
from simaccel.errors import SimAccelError
from simaccel.guards import dynamo
from simaccel.guards.dynamo.frame import SlotsPerTrace
from simaccel.guards.dynamo.retrace import RetracesPerCompile, retraces_per_compile
from simaccel.guards.dynamo.unliftable import UnliftablePerCode
from simaccel.guards.dynamo.version import REQUIRED_INTERNALS
from simaccel.guards.records import LiftOutcome, RetraceRequest
from simaccel.guards.sources import exact_source_regex


def test_supported_torch_passes() -> None:
    dynamo.assert_supported_torch()


def test_other_torch_version_fails_loudly(monkeypatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.14.0")
    with pytest.raises(SimAccelError, match="supports torch 2.13.0"):
        dynamo.assert_supported_torch()


@pytest.mark.parametrize("module_name,path", REQUIRED_INTERNALS)
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


def test_dynamo_re_traces_when_a_backend_raises_the_restart() -> None:
    """Lifting relies on it: the restart a backend raises passes through Dynamo's call of
    the backend untouched (not wrapped in BackendCompilerFailed), the frame is re-traced
    and the backend called again within the same compile (no recompile)."""
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis
    compile_ids: list[str] = []

    def restarting_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        compile_ids.append(dynamo.current_compile_id())
        if len(compile_ids) == 1:
            raise TensorifyScalarRestartAnalysis(restart_reason="test: re-trace once")
        return gm.forward

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    compiled = torch.compile(fn, backend=restarting_backend)
    torch.testing.assert_close(compiled(torch.ones(3)), torch.full((3,), 3.0))
    assert len(compile_ids) == 2 and compile_ids[0] == compile_ids[1]
    assert unique_graphs() == 1


N_GLOBAL = 3


class Repeats(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n = 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.n


def _times_n(x: torch.Tensor, n: int) -> torch.Tensor:
    return x * n


def _times_global(x: torch.Tensor) -> torch.Tensor:
    return x * N_GLOBAL


def _symint_input_sources(fn: Any, args: tuple) -> list[str]:
    """Sources of the SymInt graph inputs Dynamo makes compiling ``fn(*args)`` with
    ``dynamic=False``."""
    found: list[str] = []

    def recording_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        found.extend(
            n.meta["grapharg"].source.name for n in gm.graph.nodes
            if n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.SymInt))
        return gm.forward

    compiled = torch.compile(fn, backend=recording_backend, dynamic=False)
    torch.testing.assert_close(compiled(*args), fn(*args))
    torch._dynamo.reset()
    return found


@pytest.mark.parametrize("source,make", [
    ("L['n']", lambda: (_times_n, (torch.ones(2), 5))),
    ("G['N_GLOBAL']", lambda: (_times_global, (torch.ones(2),))),
    ("L['self'].n", lambda: (Repeats(), (torch.ones(2),))),
], ids=["argument", "global", "module attribute"])
def test_dynamic_sources_beat_every_int_specialization(source: str, make: Any) -> None:
    """An int named in ``torch.compiler.config.dynamic_sources`` becomes a SymInt graph
    input even where Dynamo otherwise bakes it in: under ``dynamic=False``, as a global,
    as an nn.Module attribute (how the lifting re-trace lifts ints)."""
    fn, args = make()
    assert _symint_input_sources(fn, args) == []  # baked in without the setting
    with torch.compiler.config.patch(dynamic_sources=exact_source_regex(source)):
        assert _symint_input_sources(fn, args) == [source]


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
    assert len(retraces_per_compile) == 0


def test_exact_source_regex_survives_dynamic_sources_parsing() -> None:
    from torch._dynamo.variables.builder import _parse_source_entry
    name = "L['cfg']['learning rate, v:2']"
    pattern, dim = _parse_source_entry(exact_source_regex(name).replace(" ", ""))
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
    def fn(x, n):  # n is also an operand, so the first trace asks to lift it
        return x.view(n, -1) * n

    for _ in range(2):
        backend = LiftingBackend()
        compiled = torch.compile(fn, backend=backend, dynamic=False)
        compiled(torch.ones(6), 2)
        # A fresh Dynamo (reset) re-learns that n is a shape: first trace asks to lift it.
        assert backend.calls == 3, backend.calls
        assert "L['n']" in backend.reports[-1].kept_sources
        torch._dynamo.reset()


# ---------------------------------------------------------------- the three registries

def test_trace_slots_live_as_long_as_their_trace() -> None:
    class Trace:  # stands for an OutputGraph: weakly referenceable, not hashable
        __hash__ = None  # type: ignore[assignment]

    slots, trace, other = SlotsPerTrace(), Trace(), Trace()
    first = slots.slot(trace, list)
    assert slots.slot(trace, list) is first and slots.slot(other, list) is not first
    del trace
    gc.collect()
    assert len(slots) == 1  # only the live trace keeps its slots


def test_retrace_requests_are_undone_newest_first() -> None:
    """Nested compiles patch the same config: undoing newest first restores the oldest
    value."""
    requests = RetracesPerCompile()
    for compile_id in ("0/0", "1/0"):
        requests.put(RetraceRequest(compile_id, {}, {}))
    assert requests.put(RetraceRequest("0/0", {}, {}, rounds=2)).rounds == 1
    assert [r.compile_id for r in requests.drain()] == ["0/0", "1/0"]
    assert len(requests) == 0


def test_unliftable_sources_are_forgotten_with_the_frame_state() -> None:
    class FrameState:  # stands for Dynamo's CodeState: reset() makes a new one
        pass

    code = _times_n.__code__
    memory, state = UnliftablePerCode(), FrameState()
    memory.add(code, state, {"L['n']": "used as a tensor shape"})
    memory.add(code, state, {"L['m']": "specialized"})
    assert memory.known(code, state) == {"L['n']": "used as a tensor shape",
                                         "L['m']": "specialized"}
    assert memory.known(code, FrameState()) == {}

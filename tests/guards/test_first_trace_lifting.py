"""Floats lifted on a frame's first trace (simaccel.guards.first_trace): no re-trace, no
value guard, never more graphs than ``lift="off"`` or Dynamo's ``eager`` backend; a
float that must stay specialized, a failing trace and a graph break are each traced
again with the float specialized, as the re-trace path would."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import simaccel
import simaccel.backend as backend
from simaccel.codegen.graph import GraphLowering
from simaccel.errors import UnsupportedOpError
from simaccel.guards import lift_memory

TOL = dict(rtol=1e-5, atol=1e-6)
SCALES = (0.5, 0.5, 0.75, 2.0, 0.125)


@pytest.fixture(autouse=True)
def fresh_lifting_memory(monkeypatch) -> None:
    """No decision of another test or xdist worker (the file-backed memory is shared)."""
    monkeypatch.setattr(lift_memory, "load", lambda code: {})
    monkeypatch.setattr(lift_memory, "store", lambda code, reasons: None)


@pytest.fixture
def traces(monkeypatch) -> list[int]:
    """One entry per call of the backend's guard step: a first trace or a re-trace."""
    calls: list[int] = []
    prepare = backend.prepare_frame
    monkeypatch.setattr(backend, "prepare_frame",
                        lambda *a, **k: calls.append(1) or prepare(*a, **k))
    return calls


class Scaled(torch.nn.Module):
    """``x * self.scale + self.shift``: two float attributes the graph computes with."""

    def __init__(self) -> None:
        super().__init__()
        self.scale, self.shift = 0.5, 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale + self.shift)


def _run(model: torch.nn.Module, set_value: Callable[[float], None],
         backend_name: Any = "simaccel", options: dict | None = None,
         make_input: Callable[[], torch.Tensor] = lambda: torch.randn(4, 8)) -> int:
    """Call the compiled model once per value of SCALES, each equal to eager; returns
    the number of graphs Dynamo compiled."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend=backend_name, dynamic=False,
                             **({"options": options} if options else {}))
    with torch.no_grad():
        for value in SCALES:
            set_value(value)
            x = make_input()
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    return counters["stats"]["unique_graphs"]


def _set_scale(model: torch.nn.Module) -> Callable[[float], None]:
    return lambda value: setattr(model, "scale", value)


def test_a_float_attribute_is_lifted_on_the_first_trace_with_no_re_trace(traces) -> None:
    model = Scaled()
    simaccel.clear_reports()
    simaccel.get_device().reset_stats()
    graphs = _run(model, _set_scale(model))
    assert graphs == 1 and len(traces) == 1  # one trace, no recompile on any new value
    report = simaccel.reports()[-1].guards
    assert not report.retraced and not report.kept
    assert set(report.lifted_sources) == {"L['self'].scale", "L['self'].shift"}
    assert all(s.lifted_by == "simaccel" for s in report.lifted)
    dropped = {d.source: d.before for d in report.dropped}
    assert dropped["L['self'].scale"].startswith("CONSTANT_MATCH: L['self'].scale == 0.5")
    assert "not installed: lifted on the first trace" in dropped["L['self'].scale"]
    stats = simaccel.get_device().runtime_stats()
    assert stats["kernel_launches"] > 0 and stats["host_fallback_ops"] == 0
    assert simaccel.get_device().dma_stats()["const.bytes"] > 0  # new values reached the bank


def test_never_more_graphs_than_lift_off_or_dynamo_eager() -> None:
    counts = {}
    for name, backend_name, options in (("auto", "simaccel", None),
                                        ("off", "simaccel", {"lift": "off"}),
                                        ("dynamo eager", "eager", None)):
        model = Scaled()
        counts[name] = _run(model, _set_scale(model), backend_name, options)
    assert counts["auto"] == 1 <= counts["dynamo eager"] <= counts["off"], counts


def test_a_frame_another_backend_compiles_keeps_dynamos_default() -> None:
    """The hook acts only on frames simaccel compiles: another backend's first trace
    bakes the float in, as Dynamo does."""
    placeholders: list[int] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        placeholders.append(sum(1 for n in gm.graph.nodes if n.op == "placeholder"))
        return gm.forward

    model = Scaled()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=capture, dynamic=False)
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), model(x))
    assert placeholders == [1]  # x only: scale and shift are constants


class Upsample(torch.nn.Module):
    """A float that sets an output size (``scale_factor``): it must stay static."""

    def __init__(self) -> None:
        super().__init__()
        self.scale, self.gain = 2.0, 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=self.scale, mode="nearest") * self.gain


def test_a_float_that_sets_a_shape_is_re_traced_specialized(traces) -> None:
    model = Upsample()
    simaccel.clear_reports()
    auto = _run(model, lambda v: setattr(model, "gain", v),
                make_input=lambda: torch.randn(1, 2, 4))
    report = simaccel.reports()[-1].guards
    assert report.lifted_sources == ("L['self'].gain",)
    kept = {k.source: k.reason for k in report.kept}
    assert "L['self'].scale" in kept, report
    assert len(traces) <= 2 and auto == 1
    for scale in (2.0, 3.0):  # a new shape factor recompiles, as under lift='off'
        model.scale = scale
        x = torch.randn(1, 2, 4)
        torch.testing.assert_close(torch.compile(model, backend="simaccel")(x), model(x))


def test_a_first_trace_that_fails_with_floats_lifted_is_traced_again_specialized(
        monkeypatch, caplog) -> None:
    """A lowering that cannot take a lifted float (injected): the frame compiles as
    under ``lift='off'``, with one WARNING line and eager's results."""
    run = GraphLowering.run

    def refuse_lifted_floats(self: GraphLowering, inputs: list[Any]) -> Any:
        if any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.dim() == 0
               for t in inputs):
            raise UnsupportedOpError("mul", "test: this lowering takes no lifted float")
        return run(self, inputs)

    monkeypatch.setattr(GraphLowering, "run", refuse_lifted_floats)
    model = Scaled()
    simaccel.clear_reports()
    with caplog.at_level(logging.WARNING, logger="simaccel"):
        auto = _run(model, _set_scale(model))
    model = Scaled()
    off = _run(model, _set_scale(model), options={"lift": "off"})
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "made the first trace fail" in warnings[0], warnings
    assert auto <= off
    first = simaccel.reports()[0].guards
    assert not first.lifted
    assert {k.source for k in first.kept} >= {"L['self'].scale", "L['self'].shift"}


class BreaksInTheMiddle(torch.nn.Module):
    """A graph break between two uses of a float attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.scale
        torch._dynamo.graph_break()
        return y + self.scale


def test_a_graph_break_is_traced_again_without_first_trace_lifting(traces) -> None:
    """The break might be the lifting's doing: the frame is traced again without it, and
    the re-trace path (which checks the break did not move) lifts the float."""
    counts = {}
    for lift in ("off", "auto"):
        traces.clear()
        model = BreaksInTheMiddle()
        counts[lift] = _run(model, _set_scale(model), options={"lift": lift})
    assert counts["auto"] <= counts["off"], counts
    assert counts["auto"] == 2  # the two halves of the frame, each compiled once
    # first half: lifted, again without, the re-trace that lifts; second half: one trace
    assert len(traces) == 4


def test_the_backend_options_are_found_through_dynamos_wrappers() -> None:
    """torch.compile's wrapper, a functools.partial and DDPOptimizer all lead to the
    simaccel backend and its options; another backend leads nowhere (no lifting)."""
    import functools

    from torch._dynamo.backends.distributed import DDPOptimizer
    from torch._dynamo.repro.after_dynamo import WrapBackendDebug

    from simaccel.guards.dynamo.first_trace import backend_options
    wrapped = WrapBackendDebug(torch._TorchCompileWrapper(
        "simaccel", "default", {"lift": "auto"}, False), "simaccel")
    assert backend_options(wrapped) == {"lift": "auto"}
    assert backend_options(functools.partial(backend.simaccel_backend,
                                             options={"keep": "L['x']"})) == {"keep": "L['x']"}
    assert backend_options(DDPOptimizer(1 << 20, wrapped).compile_fn) == {"lift": "auto"}
    assert backend_options(backend.simaccel_backend) == {}
    assert backend_options(torch._dynamo.lookup_backend("eager")) is None


@pytest.mark.parametrize("options", [{"keep": "L['self'].scale"}, {"lift": "L['self'].shift"}],
                         ids=["keep", "lift-pattern"])
def test_the_policy_decides_what_the_first_trace_lifts(traces, options) -> None:
    model = Scaled()
    simaccel.clear_reports()
    graphs = _run(model, _set_scale(model), options=options)
    assert graphs == 4  # scale keeps its value guard: every new value recompiles
    report = simaccel.reports()[0].guards
    assert report.lifted_sources == ("L['self'].shift",) and not report.retraced
    assert "L['self'].scale" in {k.source for k in report.kept}


def test_a_decision_that_raises_leaves_the_float_to_the_re_trace_path(monkeypatch,
                                                                     caplog) -> None:
    """The hook runs inside Dynamo's trace: a failing decision must not break it. The
    float is then lifted the re-trace way, with the reason at INFO."""
    from simaccel.guards.dynamo import first_trace as hook

    def broken(*args: Any) -> bool:
        raise RuntimeError("test: the decision failed")

    monkeypatch.setattr(hook._Hook, "decide", broken)
    model = Scaled()
    simaccel.clear_reports()
    with caplog.at_level(logging.INFO, logger="simaccel"):
        graphs = _run(model, _set_scale(model))
    assert graphs == 1
    report = simaccel.reports()[-1].guards
    assert report.retraced and "L['self'].scale" in report.lifted_sources
    assert any("not lifted on the first trace (RuntimeError" in r.getMessage()
               for r in caplog.records)

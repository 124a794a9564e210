"""lift='off' / patterns / keep, the report of a lifted graph, and the AOTAutograd path."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

from conftest import LiftingBackend, unique_graphs
from simaccel.errors import InvalidOptionError
from simaccel.guards.report import ARRIVES_AS_SYMINT, ARRIVES_AS_TENSOR

SHIFT = 1.0


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 2.0
        self.k = 3

    def forward(self, x, alpha, cfg):
        return torch.relu(x) * alpha * self.scale + self.k + cfg["lr"] + SHIFT


def _drive(backend, values=(0.5, 1.5, 2.5), dynamic=False) -> Net:
    net = Net()
    compiled = torch.compile(net, backend=backend, dynamic=dynamic)
    for i, value in enumerate(values):
        net.scale, net.k = 2.0 + i, 3 + i
        globals()["SHIFT"] = 1.0 + i
        args = (torch.linspace(-1, 1, 6), value, {"lr": 0.1 * (i + 1)})
        torch.testing.assert_close(compiled(*args), net(*args))
    return net


def test_auto_lifts_everything_and_reports_it() -> None:
    backend = LiftingBackend()
    _drive(backend)
    assert unique_graphs() == 1
    report = backend.report
    assert report.retraced
    assert set(report.lifted_sources) == {
        "L['alpha']", "L['self'].scale", "L['self'].k", "L['cfg']['lr']", "G['SHIFT']"}
    by_source = {s.source: s for s in report.lifted}
    assert by_source["L['alpha']"].arrives_as == ARRIVES_AS_TENSOR
    assert by_source["L['self'].k"].arrives_as == ARRIVES_AS_SYMINT
    assert by_source["G['SHIFT']"].where == "global"
    assert {d.source for d in report.dropped} == set(report.lifted_sources)
    dropped = {d.source: d for d in report.dropped}
    assert dropped["L['alpha']"].before == "CONSTANT_MATCH: L['alpha'] == 0.5"
    assert dropped["L['alpha']"].after == (
        "TYPE_MATCH: type(L['alpha']) is float; not math.isnan(L['alpha'])")
    assert report.kept == ()


def test_placeholders_and_example_inputs_match_the_report() -> None:
    backend = LiftingBackend()
    _drive(backend)
    gm, example_inputs = backend.graphs[0], backend.example_inputs[0]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for scalar in backend.report.lifted:
        node = placeholders[scalar.input_index]
        assert node.name == scalar.placeholder
        example = example_inputs[scalar.input_index]
        if scalar.kind == "float":
            assert isinstance(example, torch.Tensor) and example.dim() == 0
            assert example.dtype == torch.float64 and example.item() == scalar.value
        else:
            assert isinstance(example, torch.SymInt) and int(example) == scalar.value


def test_off_keeps_every_value_guard() -> None:
    backend = LiftingBackend(lift="off")
    _drive(backend)
    assert unique_graphs() == 3
    report = backend.reports[0]
    assert not report.retraced and report.lifted == ()
    assert all(k.reason == "lift='off'" for k in report.kept)
    assert "L['alpha']" in report.kept_sources


def test_patterns_lift_only_named_sources() -> None:
    backend = LiftingBackend(lift=["L['alpha']", "L['self'].*", "L['cfg'][*]"])
    _drive(backend, values=(0.5, 0.5, 0.5))  # only the unnamed global changes
    assert set(backend.reports[0].lifted_sources) == {
        "L['alpha']", "L['self'].scale", "L['self'].k", "L['cfg']['lr']"}
    kept = {k.source: k.reason for k in backend.reports[0].kept}
    assert kept == {"G['SHIFT']": "not named by a lift pattern"}
    assert unique_graphs() == 3  # SHIFT changed twice


def test_keep_excludes_sources() -> None:
    backend = LiftingBackend(keep=["G['SHIFT']"])
    _drive(backend)
    assert "G['SHIFT']" not in backend.reports[0].lifted_sources
    assert backend.reports[0].kept[0].reason == "keep pattern G['SHIFT']"


def test_malformed_pattern_raises_invalid_option_error() -> None:
    backend = LiftingBackend(lift=["self.scale"])
    with pytest.raises(Exception) as info:
        _drive(backend)
    chain = [info.value, info.value.__cause__, getattr(info.value, "inner_exception", None)]
    assert any(isinstance(e, InvalidOptionError) for e in chain), info.value


@pytest.mark.parametrize("dynamic", (None, False, True), ids=lambda d: f"dynamic={d}")
def test_aot_autograd_path_tensorifies_floats(dynamic) -> None:
    """What the codegen sees after AOTAutograd: floats as 0-d f64 tensors, ints as SymInts."""
    seen = []

    def fw_compiler(gm, example_inputs):
        seen.append([n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"])
        return gm.forward

    inner = aot_autograd(fw_compiler=fw_compiler)

    def backend(gm, example_inputs):
        LiftingBackend()(gm, example_inputs)
        return inner(gm, example_inputs)

    _drive(backend, dynamic=dynamic)
    assert unique_graphs() == 1
    vals = seen[-1]
    assert sum(isinstance(v, torch.Tensor) and v.dim() == 0 and v.dtype == torch.float64
               for v in vals) == 4
    assert sum(isinstance(v, torch.SymInt) for v in vals) >= 1


def test_untensorifiable_float_stays_specialized_without_wasted_retraces() -> None:
    """x.pow(alpha): AOTAutograd cannot tensorify the exponent, so alpha stays specialized;
    the frame's later compiles remember it and trace only once."""
    lifting = LiftingBackend()
    calls = lifting.reports
    inner = aot_autograd(fw_compiler=lambda gm, ex: gm.forward)

    def backend(gm, example_inputs):
        lifting(gm, example_inputs)
        return inner(gm, example_inputs)

    def fn(x, alpha):
        return x.pow(alpha) * 2

    compiled = torch.compile(fn, backend=backend, dynamic=False)
    values = (0.5, 1.5, 2.5)
    for value in values:
        x = torch.linspace(0.1, 1.0, 5)
        torch.testing.assert_close(compiled(x, value), fn(x, value))
    assert unique_graphs() == len(values)
    first_compile_calls = len(calls) - (len(values) - 1)
    assert first_compile_calls <= 4  # first trace, re-trace, tensorify restart, un-lift
    last = calls[-1]
    assert not last.retraced and "L['alpha']" in last.kept_sources
    assert "tensorify" in last.kept[0].reason


def test_dynamic_false_shape_change_recompiles_statically_and_lifts_again() -> None:
    backend = LiftingBackend()

    def fn(x, alpha):
        return x * alpha

    compiled = torch.compile(fn, backend=backend, dynamic=False)
    for n, alpha in ((4, 0.5), (4, 1.5), (6, 2.5), (6, 3.5), (4, 4.5)):
        x = torch.ones(n)
        torch.testing.assert_close(compiled(x, alpha), fn(x, alpha))
    assert unique_graphs() == 2  # one per shape, none per alpha
    for gm in backend.graphs:
        for node in gm.graph.nodes:
            value = node.meta.get("example_value")
            if isinstance(value, torch.Tensor):
                assert all(isinstance(d, int) for d in value.shape)
    assert all("L['alpha']" in r.lifted_sources for r in backend.reports)

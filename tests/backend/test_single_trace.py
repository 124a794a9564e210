"""An inference graph that AOTAutograd would trace twice for nothing is traced to ATen once
(:mod:`simaccel.guards.dynamo.single_trace`): the same ATen graph, the same results; any
graph that mutates, aliases, trains or runs under autocast still goes to AOTAutograd, and
the compile report says why."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import simaccel
import simaccel.backend as backend
from simaccel.guards import dynamo
from simaccel.guards.dynamo import single_trace
from tests.backend.test_models import assert_ran_on_device

TRACED_ONCE = backend.TRACED_ONCE


def _compile(fn, dynamic=False, **options):
    torch._dynamo.reset()
    simaccel.get_device().reset_stats()
    return torch.compile(fn, backend="simaccel", dynamic=dynamic, options=options or None)


def _capture() -> str:
    return simaccel.reports()[-1].capture


class _Block(torch.nn.Module):
    """Attention-free transformer block: layer norm, MLP with GELU, residual."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.scale = 0.5  # a float attribute: lifted on the first trace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * self.down(F.gelu(self.up(self.norm(x))))


def test_an_inference_model_is_traced_once_and_equals_eager():
    model = torch.nn.Sequential(_Block(), _Block()).eval()
    x = torch.randn(4, 8, 32)
    with torch.no_grad():
        out, expected = _compile(model)(x), model(x)
    assert out.shape == expected.shape and out.dtype == expected.dtype
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert _capture() == TRACED_ONCE
    assert simaccel.reports()[-1].call_path.startswith("direct")
    assert torch._dynamo.utils.counters["aot_autograd"]["total"] == 0
    assert_ran_on_device(expect_graphs=1)


def test_the_single_trace_gives_aotautograds_aten_graph(monkeypatch):
    """Node for node (targets in order), the graph simaccel compiles is the one
    AOTAutograd's two passes give."""
    model = torch.nn.Sequential(_Block(), torch.nn.ReLU(), _Block()).eval()
    x = torch.randn(2, 8, 32)
    seen: list[list[str]] = []
    compile_graph = backend.compile_graph

    def recording(gm, *args, **kwargs):
        seen.append([str(n.target) for n in gm.graph.nodes])
        return compile_graph(gm, *args, **kwargs)

    monkeypatch.setattr(backend, "compile_graph", recording)
    with torch.no_grad():
        once = _compile(model)(x)
        assert _capture() == TRACED_ONCE
        monkeypatch.setattr(dynamo, "compile_inference_once",
                            lambda *args: "the test asks for AOTAutograd")
        twice = _compile(model)(x)
        assert _capture() == "AOTAutograd (the test asks for AOTAutograd)"
    assert len(seen) == 2 and seen[0] == seen[1]
    torch.testing.assert_close(once, twice, rtol=0, atol=0)


def test_a_lifted_float_is_traced_once_and_changes_without_a_recompile():
    block = _Block().eval()
    compiled = _compile(block)
    x = torch.randn(4, 32)
    with torch.no_grad():
        for scale in (0.5, 0.25, -2.0):
            block.scale = scale
            torch.testing.assert_close(compiled(x), block(x), rtol=1e-4, atol=1e-5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert _capture() == TRACED_ONCE
    assert "lifted" in str(simaccel.reports()[-1].guards)
    assert_ran_on_device(expect_graphs=1)


def test_a_tensor_constant_in_the_graph_is_traced_once():
    def f(x):
        return x * torch.tensor([1.0, -2.0, 3.0]) + 1

    x = torch.randn(5, 3)
    torch.testing.assert_close(_compile(f)(x), f(x))
    assert _capture() == TRACED_ONCE


def test_duplicate_inputs_are_traced_once_without_deduplication():
    x = torch.randn(6, 4)
    out = _compile(lambda a, b: (a * b).sum(0))(x, x)
    torch.testing.assert_close(out, (x * x).sum(0), rtol=1e-5, atol=1e-6)
    assert _capture() == TRACED_ONCE


def _writes_via_aten(x):
    torch.ops.aten.add_.Tensor(x, 1.0)  # named 'add_.Tensor': seen only after tracing
    return x * 2


@pytest.mark.parametrize("fn, reason", [
    (lambda x: x.mul_(2).sum(), "writes to a tensor in place"),
    (lambda x: F.relu(x * 2, inplace=True), "writes to a tensor in place"),
    (_writes_via_aten, "the ATen graph mutates a tensor (aten.add_.Tensor)"),
    (lambda x: (x + 1, x.t()), "an output aliases an input or another output"),
    (lambda x: ((y := x * 2), y.view(-1)), "an output aliases an input or another output"),
], ids=["method", "inplace-kwarg", "aten-overload", "input-alias", "output-alias"])
def test_graphs_that_mutate_or_alias_go_to_aotautograd_and_equal_eager(fn, reason):
    x = torch.randn(4, 6)
    ref = x.clone()
    out, expected = _compile(fn)(x), fn(ref)
    torch.testing.assert_close(x, ref)  # the same mutation as eager's
    for got, want in zip(out if isinstance(out, tuple) else (out,),
                         expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(got, want)
    assert reason in _capture()


def test_symbolic_sizes_go_to_aotautograd():
    """Dynamo passes a dynamic graph its sizes as ints beside the tensors."""
    x = torch.randn(5, 7)
    torch.testing.assert_close(_compile(lambda t: t.softmax(-1), dynamic=True)(x),
                               x.softmax(-1))
    assert _capture() == "AOTAutograd ('l_t_' has a symbolic size or a data-dependent scalar)"


def test_a_lifted_int_is_traced_once_and_changes_without_a_recompile():
    """A lifted int reaches the backend as a backed SymInt beside plain tensors: one
    make_fx trace takes it as an int placeholder, as AOTAutograd's capture does."""
    def f(x, n, lr):
        return (x * n).relu() - lr * n

    compiled = _compile(f)
    x = torch.randn(6, 5)
    with torch.no_grad():
        for n, lr in ((3, 0.5), (7, 0.25), (-2, 1.5)):
            out, expected = compiled(x, n, lr), f(x, n, lr)
            assert out.shape == expected.shape and out.dtype == expected.dtype
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert torch._dynamo.utils.counters["aot_autograd"]["total"] == 0
    assert _capture() == TRACED_ONCE
    assert "L['n']" in str(simaccel.reports()[-1].guards).split("value guards kept")[0]
    assert_ran_on_device(expect_graphs=1)


def test_a_lifted_int_in_a_training_graph_goes_to_aotautograd():
    simaccel.clear_reports()
    x = torch.randn(4, 3, requires_grad=True)
    out = _compile(lambda t, n: (t * n).sum())(x, 3)
    out.backward()
    torch.testing.assert_close(x.grad, torch.full((4, 3), 3.0))
    assert [r.graph.split("_")[-1] for r in simaccel.reports()] == ["forward", "backward"]
    assert torch._dynamo.utils.counters["aot_autograd"]["total"] == 1


def test_autocast_goes_to_aotautograd():
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _compile(lambda a, b: (a @ b).float().relu())(x, w)
    assert out.dtype == torch.float32
    assert _capture() == "AOTAutograd (autocast is enabled)"


def test_reasons_read_off_the_dynamo_graph():
    """Checked before tracing, without Dynamo: no tracing context is itself a reason."""
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    assert single_trace.why_not_traced_once(gm, [torch.randn(2)], False) \
        == "Dynamo gave no fake mode"

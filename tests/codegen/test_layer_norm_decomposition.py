"""Layer norms decomposed after AOTAutograd (:mod:`simaccel.layer_norm`): the expansion
makes the very graph torch's reference decomposition makes inside AOTAutograd (node for
node, replayed layer norms too), the backend uses it only where it may (static shapes, no
symbolic ``eps``), and compiled models equal eager, forward and backward, on the device."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import aot_module_simplified

import simaccel
from simaccel.backend import decompositions
from simaccel.layer_norm import defers_layer_norm, expand_layer_norms
from simaccel.runtime.device import get_device

from tests.conftest import check

aten = torch.ops.aten
LN_TOL = {"rtol": 1e-4, "atol": 1e-5}


def _canonical(gm: torch.fx.GraphModule) -> list[tuple]:
    """The graph's ops in order, each argument node by its position: equal for equal
    graphs whatever the node names."""
    position = {node: k for k, node in enumerate(gm.graph.nodes)}

    def arg(a):
        return ("node", position[a]) if isinstance(a, torch.fx.Node) else a
    return [(n.op, str(n.target), torch.fx.node.map_aggregate(n.args, arg),
             torch.fx.node.map_aggregate(dict(n.kwargs), arg))
            for n in gm.graph.nodes]


def _aten_graph(fn, args, keep_layer_norm: bool, dynamic: bool = False) -> torch.fx.GraphModule:
    """The inference ATen graph AOTAutograd makes of ``fn`` with simaccel's table (layer
    norms expanded afterwards when kept whole)."""
    graphs = []

    def backend(gm, example_inputs):
        def compiler(graph, inputs):
            if keep_layer_norm:
                expand_layer_norms(graph)
            graphs.append(graph)
            return graph
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler,
                                     decompositions=decompositions(keep_layer_norm))
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=backend, dynamic=dynamic)(*args)
    return graphs[0]


def _layer_norms(dtype, weight=True, bias=True, shape=(2, 5, 8), normalized=(8,)):
    torch.manual_seed(0)
    w = torch.randn(normalized, dtype=dtype) if weight else None
    b = torch.randn(normalized, dtype=dtype) if bias else None
    w2 = torch.randn(normalized, dtype=dtype) if weight else None

    def fn(x):  # two layer norms of one signature (the second replays the first) and a third
        y = F.layer_norm(x, normalized, w, b, 1e-5)
        y = F.layer_norm(y.relu(), normalized, w2, b, 1e-5)
        return F.layer_norm(y, normalized, None, None, 1e-6)
    return fn, (torch.randn(shape, dtype=dtype),)


def test_the_expansion_is_the_graph_torchs_reference_makes():
    cases = [(dtype, weight, bias) for dtype in (torch.float32, torch.float64, torch.bfloat16,
                                                  torch.float16)
             for weight, bias in ((True, True), (True, False), (False, True), (False, False))]
    for dtype, weight, bias in cases:
        fn, args = _layer_norms(dtype, weight, bias)
        kept = _aten_graph(fn, args, keep_layer_norm=True)
        assert not any(n.target is aten.native_layer_norm.default for n in kept.graph.nodes)
        assert _canonical(kept) == _canonical(_aten_graph(fn, args, keep_layer_norm=False)), \
            (dtype, weight, bias)
    fn, args = _layer_norms(torch.float32, shape=(3, 4, 6), normalized=(4, 6))
    assert _canonical(_aten_graph(fn, args, True)) == _canonical(_aten_graph(fn, args, False))


def test_replayed_layer_norms_have_values_of_their_own():
    fn, args = _layer_norms(torch.float32)
    graph = _aten_graph(fn, args, keep_layer_norm=True)
    values = [n.meta["val"] for n in graph.graph.nodes if n.op == "call_function"]
    assert len({id(v) for v in values}) == len(values)
    assert all(isinstance(v, torch.Tensor) for v in values)


def test_only_static_graphs_without_a_symbolic_eps_keep_layer_norms_whole():
    seen = []

    def backend(gm, example_inputs):
        seen.append(defers_layer_norm(gm, example_inputs))
        return gm.forward
    x = torch.randn(4, 8)
    for dynamic in (False, True):
        torch._dynamo.reset()
        torch.compile(lambda x: F.layer_norm(x, (8,)), backend=backend, dynamic=dynamic)(x)
    assert seen == [True, False]  # a symbolic size would need nodes of its own
    graph = torch.fx.Graph()  # eps from a graph input (a lifted float)
    inp, eps = graph.placeholder("x"), graph.placeholder("eps")
    graph.output(graph.call_function(F.layer_norm, (inp, (8,)), {"eps": eps}))
    assert not defers_layer_norm(torch.fx.GraphModule({}, graph), [x, 1e-5])


def test_gpt2_style_layer_norms_run_on_the_device_as_eager():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = torch.nn.LayerNorm(32), torch.nn.LayerNorm(32)
            self.fc = torch.nn.Linear(32, 32)

        def forward(self, x):
            x = x + self.fc(self.ln_1(x))
            return self.ln_2(x)
    model = torch.nn.Sequential(Block(), Block()).eval()
    with torch.no_grad():
        result = check(model, torch.randn(2, 16, 32), **LN_TOL)
    report = result.reports[-1]
    assert "decompose" in report.phases_ms and not report.host_fallbacks


def _ln_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16),
                               torch.nn.GELU(), torch.nn.LayerNorm(16))


def test_a_training_step_through_kept_layer_norms_equals_eager():
    model, reference, x = _ln_mlp(), _ln_mlp(), torch.randn(8, 16)
    torch._dynamo.reset()
    simaccel.clear_reports()
    get_device().reset_stats()
    out = torch.compile(model, backend="simaccel", dynamic=False)(x)
    out.square().sum().backward()
    expected = reference(x)
    expected.square().sum().backward()
    torch.testing.assert_close(out, expected, **LN_TOL)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad, **LN_TOL)
    assert get_device().runtime_stats()["kernel_launches"] > 0
    assert [r.graph.split("_")[-1] for r in simaccel.reports()] == ["forward", "backward"]
    assert not any(r.host_fallbacks for r in simaccel.reports())


def _graphs_over_eps_changes(backend: str) -> int:
    """Graphs Dynamo made for a module whose float ``eps`` attribute changes twice (the
    results checked against eager)."""
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.eps = 1e-5

        def forward(self, x):
            return F.layer_norm(x, (8,), eps=self.eps)
    model, x = Scaled(), torch.randn(4, 8)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    for eps in (1e-5, 1e-3, 0.1):
        model.eps = eps
        torch.testing.assert_close(compiled(x), F.layer_norm(x, (8,), eps=eps), **LN_TOL)
    return counters["stats"]["unique_graphs"]


def test_a_changing_eps_recompiles_no_more_than_dynamos_default():
    """ATen takes ``eps`` as a constant (a ``double``): Dynamo specializes it on every
    backend; simaccel's graph with a symbolic ``eps`` decomposes it in AOTAutograd."""
    assert _graphs_over_eps_changes("simaccel") <= _graphs_over_eps_changes("eager")


def test_layer_norms_off_the_common_path_take_torchs_reference_on_the_device():
    """A transposed (non-contiguous) input: the expansion records torch's reference
    (a clone, then ``var_mean``, a two-output op), and the second layer norm of that
    signature replays it."""
    torch.manual_seed(0)
    w, b = torch.randn(8), torch.randn(8)

    def fn(x):
        y = F.layer_norm(x.transpose(0, 1), (8,), w, b)
        return y, F.layer_norm((x * 2).transpose(0, 1), (8,), w, b)
    result = check(fn, torch.randn(4, 6, 8) * 3 + 1, **LN_TOL)
    assert not result.reports[-1].host_fallbacks


def test_a_weight_passed_as_the_bias_too_is_not_replayed_as_two_operands():
    torch.manual_seed(0)
    w, b = torch.randn(8), torch.randn(8)

    def fn(x):
        y = F.layer_norm(x, (8,), w, w)  # one node for two operands
        return F.layer_norm(y * 3, (8,), w, b), F.layer_norm(y - 1, (8,), b, b)
    check(fn, torch.randn(4, 8), **LN_TOL)

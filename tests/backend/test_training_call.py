"""A training graph that needs none of AOTAutograd's runtime wrapper runs in simaccel's own
``autograd.Function`` once its backward is compiled (simaccel.guards.dynamo.training): the
same gradients and parameters as eager, step after step; anything else keeps the wrapper
and the compile report says why."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import simaccel
from tests.backend.test_models import assert_ran_on_device

TOL = {"rtol": 1e-4, "atol": 1e-5}
DIRECT = "SimaccelTrainingGraphBackward"
WRAPPED = "CompiledFunctionBackward"


def _fresh() -> None:
    torch._dynamo.reset()
    simaccel.clear_reports()
    simaccel.get_device().reset_stats()


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


def _forward_report():
    return next(r for r in simaccel.reports() if r.graph.endswith("forward"))


def test_sgd_steps_take_the_direct_call_and_equal_eager():
    _fresh()
    model, ref = _mlp(), _mlp()
    compiled = torch.compile(model, backend="simaccel")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, ref)]
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    kinds = []
    for _ in range(4):
        out, expected = compiled(x), ref(x)
        assert out.shape == expected.shape and out.dtype == expected.dtype
        torch.testing.assert_close(out, expected, **TOL)
        kinds.append(type(out.grad_fn).__name__)
        for o, opt in ((out, opts[0]), (expected, opts[1])):
            nn.functional.cross_entropy(o, y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, **TOL)
    # the first step runs AOTAutograd's wrapper, which compiles the backward
    assert kinds == [WRAPPED, DIRECT, DIRECT, DIRECT]
    assert _forward_report().call_path.startswith("direct training call")
    assert_ran_on_device()


def test_expanded_and_unused_output_gradients_equal_eager():
    """``sum()`` gives an expanded (stride 0) gradient; an output the loss leaves out
    gets zeros: both reach the backward as it was traced."""
    def two(x, w):
        h = x @ w
        return h.relu(), h.sigmoid()

    _fresh()
    x = torch.randn(6, 5)
    w = torch.randn(5, 3, requires_grad=True)
    w_ref = w.detach().clone().requires_grad_()
    compiled = torch.compile(two, backend="simaccel")
    for step in range(3):
        a, _ = compiled(x, w)
        a.sum().backward()
        two(x, w_ref)[0].sum().backward()
        torch.testing.assert_close(w.grad, w_ref.grad, **TOL)
    assert type(a.grad_fn).__name__ == DIRECT
    assert_ran_on_device()


def test_an_output_without_gradient_is_marked_non_differentiable():
    def scored(x, w):
        h = (x @ w).tanh()
        return h, h.argmax(-1)

    _fresh()
    x, w = torch.randn(4, 6), torch.randn(6, 5, requires_grad=True)
    w_ref = w.detach().clone().requires_grad_()
    compiled = torch.compile(scored, backend="simaccel")
    for _ in range(3):
        h, index = compiled(x, w)
        assert not index.requires_grad and index.dtype == torch.int64
        h.pow(2).sum().backward()
    expected_h, expected_index = scored(x, w_ref)
    for _ in range(3):
        expected_h.pow(2).sum().backward(retain_graph=True)
    torch.testing.assert_close(index, expected_index)
    torch.testing.assert_close(w.grad, w_ref.grad, **TOL)
    assert type(h.grad_fn).__name__ == DIRECT


def test_retained_graph_runs_the_backward_twice():
    _fresh()
    model, ref = _mlp(), _mlp()
    compiled = torch.compile(model, backend="simaccel")
    x = torch.randn(8, 16)
    compiled(x).sum().backward()  # the wrapper's step: the backward compiles
    model.zero_grad()
    loss = compiled(x).square().mean()
    loss.backward(retain_graph=True)
    loss.backward()
    expected = ref(x).square().mean()
    expected.backward(retain_graph=True)
    expected.backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)


def test_double_backward_raises():
    _fresh()
    w = torch.randn(5, 5, requires_grad=True)
    compiled = torch.compile(lambda x, w: (x @ w).sin(), backend="simaccel")
    x = torch.randn(3, 5)
    compiled(x, w).sum().backward()
    out = compiled(x, w)
    assert type(out.grad_fn).__name__ == DIRECT
    (grad,) = torch.autograd.grad(out.sum(), w, create_graph=True)
    with pytest.raises(RuntimeError):
        grad.sum().backward()


def test_a_graph_updating_running_stats_keeps_the_wrapper():
    """BatchNorm in training mode updates its running statistics in place: an input
    mutation, which AOTAutograd's wrapper applies."""
    _fresh()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU())
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="simaccel")
    x = torch.randn(16, 8)
    for _ in range(3):
        out = compiled(x)
        out.sum().backward()
        ref(x).sum().backward()
    assert type(out.grad_fn).__name__ == WRAPPED
    assert "mutates" in _forward_report().call_path
    torch.testing.assert_close(model[1].running_mean, ref[1].running_mean, **TOL)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)

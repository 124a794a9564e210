"""Eager semantics the backend must keep: in-place updates of inputs, outputs that alias
inputs, views as outputs, Python-scalar outputs."""
from __future__ import annotations

import torch

import simaccel


def _run(fn, *args):
    torch._dynamo.reset()
    simaccel.get_device().reset_stats()
    return torch.compile(fn, backend="simaccel", dynamic=False)(*args)


def test_inplace_add_on_input_updates_caller_tensor():
    def f(x):
        x.add_(1)
        return x * 2

    x, ref = torch.randn(4, 5), None
    ref = x.clone()
    out = _run(f, x)
    expected = f(ref)
    torch.testing.assert_close(x, ref)          # the caller's tensor was mutated, as eager
    torch.testing.assert_close(out, expected)
    assert simaccel.get_device().runtime_stats()["kernel_launches"] > 0


def test_inplace_slice_assignment():
    def f(x):
        x[:, 0] = 0.0
        return x.sum(1)

    x = torch.randn(3, 4)
    ref = x.clone()
    torch.testing.assert_close(_run(f, x), f(ref))
    torch.testing.assert_close(x, ref)


def test_output_aliasing_input_is_a_view_like_eager():
    def f(x):
        return x.t(), x[1:], x + 1

    x = torch.randn(4, 6)
    t, s, y = _run(f, x)
    torch.testing.assert_close(t, x.t())
    torch.testing.assert_close(s, x[1:])
    torch.testing.assert_close(y, x + 1)
    x.mul_(0)  # aliases follow their base, exactly as in eager
    assert t.abs().sum() == 0 and s.abs().sum() == 0


def test_noncontiguous_output_strides_match_eager():
    def f(x):
        return (x * 2).transpose(0, 1)

    x = torch.randn(3, 5)
    out = _run(f, x)
    torch.testing.assert_close(out, f(x))
    assert out.shape == (5, 3)


def _last_call_path() -> str:
    return simaccel.reports()[-1].call_path


def test_plain_inference_graph_is_called_without_the_aot_runtime_wrapper():
    """No mutation, no aliasing, no grad: Dynamo calls the compiled graph directly."""
    x = torch.randn(8, 16)
    out = _run(lambda t: (t * 2 + 1).relu().sum(-1), x)
    torch.testing.assert_close(out, (x * 2 + 1).relu().sum(-1), rtol=1e-4, atol=1e-5)
    assert _last_call_path().startswith("direct")
    assert simaccel.get_device().runtime_stats()["kernel_launches"] > 0


def test_an_input_updated_in_place_is_called_directly_and_bumps_its_version_as_eager():
    """A data mutation kept in the graph needs only the wrapper's version bump."""
    x, ref = torch.randn(4, 5), None
    ref = x.clone()
    compiled_start, eager_start = x._version, ref._version
    torch._dynamo.reset()
    step = torch.compile(lambda t: t.mul_(3).sum(), backend="simaccel", dynamic=False)
    for _ in range(3):
        out, expected = step(x), ref.mul_(3).sum()
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x, ref, rtol=1e-6, atol=1e-6)
    assert x._version - compiled_start == ref._version - eager_start == 3
    assert _last_call_path() == ("direct (inference graph, no AOTAutograd runtime wrapper "
                                 "needed; 1 mutated input(s) version-bumped)")


def test_graphs_needing_the_runtime_wrapper_keep_it_and_say_why():
    base = torch.randn(2, 8)
    ref = base.clone()

    def update_and_read(a, b):  # overlapping views: AOTAutograd merges them into one base
        a.add_(1)
        return b * 2
    out = _run(update_and_read, base[:, :6], base[:, 2:])
    expected = update_and_read(ref[:, :6], ref[:, 2:])
    assert torch.equal(base, ref) and torch.equal(out, expected)
    assert _last_call_path() == ("AOTAutograd runtime wrapper (the graph's inputs are not "
                                 "the frame's (deduplicated or merged inputs))")

    y = torch.randn(3, 4)
    plus, view = _run(lambda t: (t + 1, t.t()), y)
    assert view._base is y and torch.equal(plus, y + 1)  # a view of the caller's tensor
    assert "aliases" in _last_call_path()


def test_autocast_keeps_the_runtime_wrapper():
    """Under autocast the graph has its casts baked in; host ops must not autocast again,
    which the wrapper ensures."""
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _run(lambda a, b: (a @ b).float().relu(), x, w)
        expected = (x @ w).float().relu()
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
    assert _last_call_path() == "AOTAutograd runtime wrapper (autocast is enabled)"


def test_training_graph_runs_through_aotautograd():
    x = torch.randn(4, 6, requires_grad=True)
    out = _run(lambda t: (t.sin() * 2).sum(), x)
    out.backward()
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())
    forward, backward = simaccel.reports()[-2:]
    assert forward.call_path.startswith("direct training call") and backward.call_path == ""

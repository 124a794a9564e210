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

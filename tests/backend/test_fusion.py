"""Fusion is real: pointwise chains become one kernel with no intermediate buffer, and a
pointwise chain feeding a reduction fuses into the reduction."""
from __future__ import annotations

import torch

import simaccel


def _compile_and_check(fn, *args):
    torch._dynamo.reset()
    simaccel.get_device().reset_stats()
    got = torch.compile(fn, backend="simaccel", dynamic=False)(*args)
    torch.testing.assert_close(got, fn(*args), rtol=1e-5, atol=1e-6)
    report = simaccel.reports()[-1]
    assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 0
    return report


def chain8(x, y):
    return ((((x * 2.0 + y).sin() - 0.5).abs().sqrt() * y).tanh() + 1.0).relu()


def test_eight_op_pointwise_chain_is_one_kernel():
    x, y = torch.randn(64, 33), torch.randn(33)  # y broadcasts
    report = _compile_and_check(chain8, x, y)
    assert len(report.kernels) == 1
    assert report.kernels[0].kind == "pointwise"
    # only the inputs and the output are device buffers: nothing intermediate
    assert report.memory_plan["naive_bytes"] <= (64 * 33 * 2 + 33 + 256) * 4 + 3 * 512


def test_pointwise_chain_into_sum_is_one_kernel():
    x = torch.randn(32, 128)
    report = _compile_and_check(lambda x: (x * 3.0 + 1.0).exp().sum(-1), x)
    assert [k.kind for k in report.kernels] == ["reduction"]


def test_kernel_launch_count_per_call():
    x = torch.randn(16, 16)
    _compile_and_check(chain8, x, x)
    assert simaccel.get_device().runtime_stats()["kernel_launches"] == 1

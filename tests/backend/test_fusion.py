"""Fusion is real: pointwise chains become one kernel with no intermediate buffer, a
pointwise chain feeding a reduction fuses into the reduction, and sibling reductions
over the same loop nest fuse horizontally into one kernel."""
from __future__ import annotations

import pathlib

import torch
import torch.nn.functional as F

import simaccel
from tests.conftest import REDUCTION_TOL, check


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
    torch.manual_seed(0)  # sin/sqrt/tanh at rtol 1e-5: fixed inputs, no flaky draws
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


# --------------------------------------------------------------------------- horizontal fusion
# Sibling reductions over the same loop nest become one kernel that reads the input once.


def _reduction_kernels(fn, *args):
    result = check(fn, *args, **REDUCTION_TOL)
    kernels = [k for r in result.reports for k in r.kernels]
    assert result.runtime_stats["kernel_launches"] == len(kernels)
    return kernels


def _source(kernel) -> str:
    return pathlib.Path(kernel.path).read_text()


def test_sibling_row_reductions_are_one_kernel():
    x = torch.randn(64, 128)
    kernels = _reduction_kernels(lambda x: (x.sum(1), x.amax(1), x.mean(1)), x)
    assert [k.kind for k in kernels] == ["reduction"]
    src = _source(kernels[0])
    assert src.count("for r0 in") == 1  # one pass over the input
    assert "acc1" in src and "acc2" not in src  # sum and mean share one accumulator


def test_sibling_reductions_with_their_own_bodies_and_keepdim():
    x = torch.randn(16, 8, 32)

    def fn(x):
        return ((x * 2).sum(-1), x.abs().amin(-1, keepdim=True), (x - 1).prod(-1),
                x.exp().mean(-1))
    kernels = _reduction_kernels(fn, x)
    assert len(kernels) == 1


def test_full_reductions_are_siblings():
    x = torch.randn(1000)
    assert len(_reduction_kernels(lambda x: (x.sum(), x.max(), x.min()), x)) == 1


def test_reductions_over_different_dims_are_not_fused():
    x = torch.randn(32, 48)
    kernels = _reduction_kernels(lambda x: (x.sum(0), x.sum(1), x.amax(0)), x)
    # sum(0) and amax(0) share a loop nest, sum(1) has another
    assert len(kernels) == 2


def test_reduction_reading_a_sibling_result_is_a_later_row_stage():
    x = torch.randn(32, 64)

    def fn(x):
        centred = x - x.mean(-1, keepdim=True)
        return centred.abs().amax(-1), x.sum(-1)
    kernels = _reduction_kernels(fn, x)
    # mean and sum fuse (same body: one accumulator); amax reads mean's output in its own
    # row, so it runs after them in the same row kernel, not as a sibling
    assert [k.kind for k in kernels] == ["row"]
    assert "s1acc0 = " in _source(kernels[0]) and "s0acc1" not in _source(kernels[0])


def test_arg_reductions_stay_alone():
    x = torch.randn(16, 40)
    kernels = _reduction_kernels(lambda x: (x.max(-1), x.sum(-1)), x)
    # max.dim: values (max, fused with sum) and indices (argmax, branches per element)
    assert len(kernels) == 2


def test_layer_norm_statistics_share_a_pass():
    x, w, b = torch.randn(8, 256), torch.randn(256), torch.randn(256)
    kernels = _reduction_kernels(
        lambda x, w, b: F.gelu(F.layer_norm(x, (256,), w, b)), x, w, b)
    # one row kernel: per row, the mean, then the variance and sum (they read the mean),
    # then the normalised row (reads both), each pass over a row that is in cache
    assert [k.kind for k in kernels] == ["row"]

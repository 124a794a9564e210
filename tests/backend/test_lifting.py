"""Scalar lifting end to end on the simaccel device: one graph for every value, results
equal eager, and the new values reach the device through the constant bank."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch._dynamo.utils import counters

import simaccel
from tests.guards.scalar_cases import CASES, Case

DYNAMIC = [None, False, True]


@pytest.mark.parametrize("dynamic", DYNAMIC, ids=lambda d: f"dynamic={d}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_recompile_matrix_one_graph_on_simaccel(case: Case, dynamic):
    fn, args_for = case.build()
    compiled = torch.compile(fn, backend="simaccel", dynamic=dynamic)
    for value in case.values:
        args = args_for(value)
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1
    rt = simaccel.get_device().runtime_stats()
    assert rt["kernel_launches"] > 0 and rt["host_fallback_ops"] == 0


def test_optimizer_step_with_new_lr_each_call():
    p, g = torch.randn(64), torch.randn(64)

    def step(p, g, lr):
        return p - lr * g

    compiled = torch.compile(step, backend="simaccel", dynamic=False)
    device = simaccel.get_device()
    for call in range(6):
        lr = 0.1 * (call + 1) ** 0.5  # warm-up schedule
        before = device.dma_stats()["const.transfers"]
        torch.testing.assert_close(compiled(p, g, lr), step(p, g, lr), rtol=1e-6, atol=1e-7)
        assert device.dma_stats()["const.transfers"] - before == 1
    assert counters["stats"]["unique_graphs"] == 1


def test_softmax_with_new_temperature_each_call():
    logits = torch.randn(4, 32)

    def sample_probs(logits, temperature):
        return torch.softmax(logits / temperature, dim=-1)

    compiled = torch.compile(sample_probs, backend="simaccel", dynamic=False)
    device = simaccel.get_device()
    for temperature in (0.7, 0.8, 1.0, 1.3, 2.0, 0.05):
        before = device.dma_stats()["const.transfers"]
        torch.testing.assert_close(compiled(logits, temperature),
                                   sample_probs(logits, temperature), rtol=1e-5, atol=1e-6)
        assert device.dma_stats()["const.transfers"] - before == 1
    assert counters["stats"]["unique_graphs"] == 1


FLOATS = st.one_of(
    st.sampled_from([0.0, 1.0, -1.0, 1e-45, -1e-38, 1e-300, 3e38, 1e300, -2.5e10]),
    st.floats(allow_nan=False, allow_infinity=False, width=64))
INTS = st.one_of(
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**62, -2**62]),
    st.integers(min_value=-2**62, max_value=2**62))


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(values=st.lists(st.tuples(FLOATS, INTS), min_size=3, max_size=6))
def test_hypothesis_value_sequences_equal_eager(values):
    torch._dynamo.reset()
    x = torch.linspace(-3, 3, 12, dtype=torch.float32)
    xd = x.double()

    def f(x, xd, alpha, n):
        return x * alpha + 1.0, xd * n - alpha, (x * 0 + n).to(torch.int64) * 3

    compiled = torch.compile(f, backend="simaccel", dynamic=False)
    for alpha, n in values:
        got, expected = compiled(x, xd, alpha, n), f(x, xd, alpha, n)
        for a, b in zip(got, expected):
            assert a.dtype == b.dtype and a.shape == b.shape
            torch.testing.assert_close(a, b, rtol=1e-6, atol=0, equal_nan=True)


def test_nan_and_inf_values_are_correct():
    x = torch.randn(8)
    compiled = torch.compile(lambda x, a: x * a, backend="simaccel", dynamic=False)
    for a in (1.5, math.nan, math.inf, -math.inf, 2.5):
        torch.testing.assert_close(compiled(x, a), x * a, equal_nan=True)


def test_signed_zero_change_reaches_the_device():
    x = torch.ones(4)
    compiled = torch.compile(lambda x, a: x * a, backend="simaccel", dynamic=False)
    for a in (0.0, -0.0, 0.0, 2.0, -0.0):
        out = compiled(x, a)
        assert torch.equal(torch.signbit(out), torch.signbit(x * a)), a

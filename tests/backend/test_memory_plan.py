"""Static memory planning on real graphs, and the constant bank's one-descriptor upload."""
from __future__ import annotations

import torch
import torch.nn as nn

import simaccel
from tests.backend.models import TransformerBlock, cnn, mlp


def _forward_plan(model: nn.Module, *args) -> dict[str, int]:
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend="simaccel")(*args)
    return simaccel.reports()[-1].memory_plan


def test_planned_peak_is_within_ten_percent_of_the_liveness_lower_bound():
    cases = [(mlp().eval(), torch.randn(8, 16)), (cnn().eval(), torch.randn(2, 3, 8, 8)),
             (TransformerBlock().eval(), torch.randint(0, 50, (2, 8)))]
    for model, x in cases:
        plan = _forward_plan(model, x)
        assert plan["planned_bytes"] <= 1.1 * plan["lower_bound_bytes"], (model, plan)


def test_sixteen_layer_mlp_plans_at_least_2x_below_the_naive_sum():
    layers = []
    for _ in range(16):
        layers += [nn.Linear(64, 64), nn.Tanh()]
    plan = _forward_plan(nn.Sequential(*layers).eval(), torch.randn(32, 64))
    assert plan["naive_bytes"] >= 2 * plan["planned_bytes"], plan


SCALARS = {f"s{k}": 0.5 + k for k in range(8)}


def test_eight_lifted_scalars_cost_one_descriptor_per_call():
    def f(x):
        y = x
        for k in range(8):
            y = y * SCALARS[f"s{k}"] + k
        return y

    torch._dynamo.reset()
    device = simaccel.get_device()
    compiled = torch.compile(f, backend="simaccel", dynamic=False)
    x = torch.randn(16)
    compiled(x)
    assert len(simaccel.reports()[-1].guards.lifted) == 8
    for call in range(5):
        SCALARS["s3"] = 10.0 + call
        before = device.dma_stats()
        torch.testing.assert_close(compiled(x), f(x))
        after = device.dma_stats()
        assert after["const.transfers"] - before["const.transfers"] == 1
        assert after["descriptors"] - before["descriptors"] == 3  # input, bank, output

"""Image models fully on the device: a ResNet-style CNN with grouped and dilated
convolutions, and an encoder-decoder with bilinear upsampling, inference and a training
step, equal to eager (rtol 1e-4 / atol 1e-5) with no host fallback."""
from __future__ import annotations

import copy

import pytest
import torch

import simaccel
from tests.models.vision import GroupedResNet, UpsamplingNet

TOL = {"rtol": 1e-4, "atol": 1e-5}


def _assert_on_device() -> None:
    stats = simaccel.get_device().runtime_stats()
    assert stats["kernel_launches"] > 0, stats
    assert stats["host_fallback_ops"] == 0, stats
    fallbacks = [fb for r in simaccel.reports() for fb in r.host_fallbacks]
    assert not fallbacks, fallbacks


@pytest.mark.parametrize("make,shape", [(GroupedResNet, (2, 3, 16, 16)),
                                        (UpsamplingNet, (2, 3, 12, 16))],
                         ids=["grouped_resnet", "upsampling"])
def test_inference_on_device(make, shape):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(*shape)
    simaccel.clear_reports()
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend="simaccel")(x)
    torch.testing.assert_close(got, expected, **TOL)
    _assert_on_device()


@pytest.mark.parametrize("make,shape", [(GroupedResNet, (2, 3, 16, 16)),
                                        (UpsamplingNet, (2, 3, 12, 16))],
                         ids=["grouped_resnet", "upsampling"])
def test_training_step_on_device(make, shape):
    torch.manual_seed(0)
    model = make().train()
    twin = copy.deepcopy(model)
    x = torch.randn(*shape)
    twin(x).square().mean().backward()
    simaccel.clear_reports()
    torch.compile(model, backend="simaccel")(x).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name, **TOL)
    _assert_on_device()

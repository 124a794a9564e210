"""Scaled dot-product attention forward and backward equal eager on the device (torch
2.13's own decomposition of the CPU flash-attention op returns the attention weights as
its logsumexp, which made every attention gradient wrong; see simaccel/attention.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import simaccel
from tests.conftest import REDUCTION_TOL

SHAPE = (2, 4, 8, 8)


def _mask(kind: str) -> dict:
    if kind == "bool_mask":
        return {"attn_mask": (torch.rand(8, 8) > 0.3) | torch.eye(8, dtype=torch.bool)}
    if kind == "float_mask":
        return {"attn_mask": torch.randn(8, 8)}
    return {"is_causal": kind == "causal"}


@pytest.mark.parametrize("kind", ["causal", "plain", "bool_mask", "float_mask"])
def test_attention_gradients_equal_eager(kind):
    torch.manual_seed(0)
    extra = _mask(kind)

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **extra)

    inputs = [torch.randn(*SHAPE, requires_grad=True) for _ in range(3)]
    reference = [t.detach().clone().requires_grad_() for t in inputs]
    device = simaccel.get_device()
    device.reset_stats()
    out = torch.compile(attention, backend="simaccel")(*inputs)
    want = attention(*reference)
    torch.testing.assert_close(out, want, **REDUCTION_TOL)
    out.square().sum().backward()
    want.square().sum().backward()
    for got, expected in zip(inputs, reference):
        torch.testing.assert_close(got.grad, expected.grad, **REDUCTION_TOL)
    stats = device.runtime_stats()
    assert stats["kernel_launches"] > 0 and stats["host_fallback_ops"] == 0


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_fully_masked_row_attends_to_nothing_as_in_eager(dynamic):
    """A padded sequence's query row with every key masked: eager's fused op returns 0
    there (not 0 / 0); the device's decomposition (static GEMM pair, dynamic shapes)
    does too, and the gradients stay finite and equal eager's."""
    torch.manual_seed(0)
    mask = torch.rand(6, 6) > 0.4
    mask[2] = False
    mask[4] = True

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    inputs = [torch.randn(2, 3, 6, 8, requires_grad=True) for _ in range(3)]
    reference = [t.detach().clone().requires_grad_() for t in inputs]
    out = torch.compile(attention, backend="simaccel", dynamic=dynamic)(*inputs)
    want = attention(*reference)
    assert torch.equal(want[:, :, 2], torch.zeros_like(want[:, :, 2]))
    torch.testing.assert_close(out, want, **REDUCTION_TOL)
    out.square().sum().backward()
    want.square().sum().backward()
    for got, expected in zip(inputs, reference):
        torch.testing.assert_close(got.grad, expected.grad, **REDUCTION_TOL)

"""GEMM operands read as stored: a lazy value two GEMMs read (a ReLU layer's masked
gradient, ``g @ w`` and ``g.T @ h`` in its backward) is computed once, and the GEMM
reading it transposed reads that buffer column-major instead of a transposed copy."""
from __future__ import annotations

import torch

from simaccel.codegen.graph import GraphLowering
from simaccel.codegen.ir import LibraryKernel, PointwiseKernel
from tests.conftest import check


def _masked_gradient_products(g, h, x, w):
    masked = torch.where(h > 0, g, 0.0)
    return masked @ w, masked.t() @ x


def _args() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(64, 96, generator=gen), torch.randn(64, 96, generator=gen),
            torch.randn(64, 48, generator=gen), torch.randn(96, 32, generator=gen)]


def test_a_lazy_operand_of_two_gemms_is_computed_once():
    args = _args()
    gm = torch.fx.experimental.proxy_tensor.make_fx(_masked_gradient_products)(*args)
    steps = GraphLowering(gm).run(list(args)).steps
    (masked,) = [s for s in steps if isinstance(s, PointwiseKernel)]
    first, second = [s for s in steps if isinstance(s, LibraryKernel)]
    assert first.buffers[1] == second.buffers[1] == masked.out.buffer
    a_transposed = second.params[8]
    assert a_transposed == 1 and first.params[8] == 0


def test_products_equal_eager():
    check(_masked_gradient_products, *_args(), rtol=1e-4, atol=1e-4)

"""GEMM operands read as stored: a lazy value two GEMMs read (a ReLU layer's masked
gradient, ``g @ w`` and ``g.T @ h`` in its backward) is computed once, and the GEMM
reading it transposed reads that buffer column-major instead of a transposed copy."""
from __future__ import annotations

import torch

from simaccel.codegen.graph import GraphLowering
from simaccel.codegen.ir import ExternKernel, LibraryKernel, PointwiseKernel
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
    # both products' (a operand, a stored transposed): two library GEMMs, or one pair
    # (simaccel.codegen.gemm_pairs: buffers out, a, b per part; params m, k, n, a_off,
    # b_off, a_t, b_t per part)
    operands = [(s.buffers[1], s.params[8]) for s in steps if isinstance(s, LibraryKernel)]
    for s in steps:
        if isinstance(s, ExternKernel) and s.name.endswith("_pair"):
            operands += [(s.buffers[1], s.params[5]), (s.buffers[4], s.params[12])]
    assert operands == [(masked.out.buffer, 0), (masked.out.buffer, 1)]


def test_products_equal_eager():
    check(_masked_gradient_products, *_args(), rtol=1e-4, atol=1e-4)

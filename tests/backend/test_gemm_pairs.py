"""Two independent small GEMMs run as one launch, each on a core of its own
(simaccel.codegen.gemm_pairs): a linear layer's backward (its input's and its weight's
gradients) equals eager, compiled and in its tier-0 numpy form, for every operand layout;
dependent, large or mixed-dtype products stay library calls."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import simaccel
from simaccel.codegen.gemm_pairs import PAIR_MAX_MACS, pair_gemms
from simaccel.codegen.ir import LibraryKernel
from simaccel.codegen.library import ONEDNN_MIN_MACS, gemm
from tests.backend.test_models import assert_ran_on_device

#: float32 products of the same BLAS as eager's; only the order of a sum can differ
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _kernel_names() -> list[str]:
    return [k.name for r in simaccel.reports() for k in r.kernels]


def _pairs() -> int:
    return sum(name.endswith("_pair") for name in _kernel_names())


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 32))


@pytest.mark.parametrize("tier0", [False, "only"])
def test_a_linear_layers_backward_runs_its_two_products_as_a_pair(tier0):
    simaccel.clear_reports()
    model, ref = _mlp(), _mlp()
    compiled = torch.compile(model, backend="simaccel", options={"tier0": tier0})
    x, y = torch.randn(32, 64), torch.randint(0, 32, (32,))
    for _ in range(3):
        out, expected = compiled(x), ref(x)
        torch.testing.assert_close(out, expected, **TOL)
        for o in (out, expected):
            nn.functional.cross_entropy(o, y).backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert p.grad.shape == q.grad.shape and p.grad.dtype == q.grad.dtype
            torch.testing.assert_close(p.grad, q.grad, **TOL)
            p.grad = q.grad = None
    # the last layer's input and weight gradients: one launch (the first layer's input
    # needs no gradient, so its weight's product has no partner)
    assert _pairs() == 1
    assert_ran_on_device()


@pytest.mark.parametrize("tier0", [False, "only"])
def test_a_pair_writes_a_host_mapped_weight_gradient_into_each_calls_tensor(tier0):
    """batch 8, 512 -> 512: the weight's gradient (1 MiB) is a host-mapped output, a new
    tensor every call, written by the pair in place."""
    simaccel.clear_reports()

    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512))

    model, ref = make(), make()
    compiled = torch.compile(model, backend="simaccel", options={"tier0": tier0})
    grads = []
    for step in range(3):
        x = torch.randn(8, 64)
        for out in (compiled(x), ref(x)):
            out.square().sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **TOL)
        grads.append(model[2].weight.grad)
        for p in (*model.parameters(), *ref.parameters()):
            p.grad = None
    assert len({g.data_ptr() for g in grads}) == 3  # each step's own tensor
    assert _pairs() == 1
    (backward,) = [r for r in simaccel.reports() if r.graph.endswith("backward")]
    weight_grad = 512 * 512 * 4
    assert [n for _, _, n in backward.host_mapped_outputs] == [weight_grad]
    dma = simaccel.get_device().dma_stats()
    assert dma["d2h.mapped_writes"] >= 3 and dma["d2h.mapped_bytes"] >= 3 * weight_grad
    assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 0


@pytest.mark.parametrize("tier0", [False, "only"])
def test_pairs_equal_eager_for_every_operand_layout(tier0):
    simaccel.clear_reports()

    def products(a, b, c, d):
        # a row-major and a transposed operand on each side, and a row offset
        return a @ b.t(), c.t() @ d[2:]

    a, b, c, d = torch.randn(32, 48), torch.randn(64, 48), torch.randn(48, 32), \
        torch.randn(50, 64)
    compiled = torch.compile(products, backend="simaccel", options={"tier0": tier0})
    for got, expected in zip(compiled(a, b, c, d), products(a, b, c, d)):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, **TOL)
    assert _pairs() == 1
    assert_ran_on_device()


def test_float64_products_pair_too():
    simaccel.clear_reports()

    def products(a, b, c, d):
        return a @ b, c @ d

    args = [torch.randn(*shape, dtype=torch.float64)
            for shape in ((32, 64), (64, 48), (48, 32), (32, 64))]
    got = torch.compile(products, backend="simaccel")(*args)
    for g, e in zip(got, products(*args)):
        assert g.dtype == torch.float64
        torch.testing.assert_close(g, e)
    assert _pairs() == 1


@pytest.mark.parametrize("case", ["dependent", "mixed dtypes", "large"])
def test_products_that_must_not_pair_stay_library_calls(case):
    simaccel.clear_reports()
    if case == "dependent":  # the second reads the first's result
        def fn(a, b, c):
            return (a @ b) @ c
        args = [torch.randn(32, 48), torch.randn(48, 48), torch.randn(48, 32)]
    elif case == "mixed dtypes":
        def fn(a, b, c):
            return a @ b, c.double() @ c.double()
        args = [torch.randn(32, 48), torch.randn(48, 48), torch.randn(48, 48)]
    else:  # each above PAIR_MAX_MACS: two library calls across both cores
        n = 256
        assert n ** 3 > PAIR_MAX_MACS
        # and no pair ever takes a product oneDNN's inner product would
        assert PAIR_MAX_MACS < ONEDNN_MIN_MACS

        def fn(a, b, c):
            return a @ b, a @ c
        args = [torch.randn(n, n) for _ in range(3)]
    got = torch.compile(fn, backend="simaccel")(*args)
    expected = fn(*args)
    for g, e in zip(got if isinstance(got, tuple) else [got],
                    expected if isinstance(expected, tuple) else [expected]):
        torch.testing.assert_close(g, e, **TOL)
    assert _pairs() == 0
    assert sum(name.startswith("gemm") for name in _kernel_names()) == 2
    assert_ran_on_device()


def _library_gemm(name: str, out: str, a: str, b: str, m: int = 64, k: int = 32,
                  n: int = 64) -> LibraryKernel:
    return LibraryKernel(name, gemm, [out, a, b], [1, m, k, n, 0, 0, 0, 0, 0, 0],
                         2 * m * k * n, 4 * (m * k + k * n + m * n), frozenset({out}))


def test_only_adjacent_gemms_pair_and_each_joins_one_pair():
    buffers = {name: SimpleNamespace(dtype="float32") for name in "abcdefghijxyz"}
    three = [_library_gemm("g0", "x", "a", "b"), _library_gemm("g1", "y", "a", "c"),
             _library_gemm("g2", "z", "a", "d")]
    paired = pair_gemms(three, buffers)
    # the first two join; the third has no partner left
    assert [s.name for s in paired] == ["g0_pair", "g2"]
    assert paired[0].buffers == ["x", "a", "b", "y", "a", "c"]
    assert paired[0].writes == {"x", "y"} and paired[0].parallel
    between = [three[0], SimpleNamespace(name="other", reads=frozenset(), writes=frozenset()),
               three[1]]
    assert [s.name for s in pair_gemms(between, buffers)] == ["g0", "other", "g1"]

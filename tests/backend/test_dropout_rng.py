"""Active dropout on the device (:mod:`simaccel.dropout_rng`): the mask is a hash of a
per-call seed, computed in the kernel that uses it, with no host fallback.

Masks are random, so eager's cannot be matched bit for bit (no backend's mask is eager's).
Each case checks what does hold: the kept fraction (binomial bounds), kept values equal
to eager's arithmetic ``x * 1 * (1 / (1 - p))`` exactly, fresh masks per call that
repeat under ``torch.manual_seed``, independent streams per dropout, and, for whole
models, eager run on the same masks (:func:`eager_with_seed`) equal to the compiled
forward and backward."""
from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import numba
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

import simaccel
from simaccel.bench.gpt2 import gpt2
from simaccel.codegen import hash_lib, kernel_lib  # noqa: F401 - kernel_lib compiles it
from simaccel.dropout_rng import draw_seed, hash_dropout, random_bits

#: elements per random draw: the kept fraction's standard deviation is ~5e-4 at p=0.5
N = 1 << 20


def _compile(fn, **kwargs):
    torch._dynamo.reset()
    counters.clear()
    simaccel.clear_reports()
    simaccel.get_device().reset_stats()
    return torch.compile(fn, backend="simaccel", **kwargs)


def _assert_on_device(rewritten: int) -> None:
    """``rewritten`` dropouts seeded on the device, kernels launched, no host fallback."""
    stats = simaccel.get_device().runtime_stats()
    assert stats["host_fallback_ops"] == 0
    assert stats["kernel_launches"] > 0
    dma = simaccel.get_device().dma_stats()
    assert dma["h2d.bytes"] + dma["d2h.bytes"] > 0 and dma["const.bytes"] > 0  # the seed
    reports = simaccel.reports()
    assert not [f for r in reports for f in r.host_fallbacks]
    lines = [line for r in reports for line in r.rewrites if line.startswith("dropout")]
    assert len(lines) == rewritten, lines


def _within_binomial(kept: int, n: int, q: float, sigmas: float = 6.0) -> bool:
    return abs(kept - n * q) <= sigmas * (n * q * (1 - q)) ** 0.5 + 1


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    return F.dropout(x, p, training=True)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_the_kept_fraction_is_one_minus_p(p):
    x = torch.ones(N)
    out = _compile(dropout)(x, p)
    scale = torch.ones(1) * (1.0 / (1.0 - p))  # eager's rounding of the kept values
    kept = out != 0
    assert out.dtype == x.dtype and out.shape == x.shape
    assert torch.equal(out[kept], scale.expand(int(kept.sum())))
    assert _within_binomial(int(kept.sum()), N, 1 - p)
    _assert_on_device(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_kept_values_are_eagers_arithmetic(dtype):
    """Kept elements are ``x * 1 * scale`` rounded once as eager rounds them; dropped
    ones 0 (and NaN where ``x`` is inf, as eager's ``x * 0``)."""
    torch.manual_seed(0)
    x = torch.randn(4096, 64, dtype=dtype)
    x[0, :8] = torch.inf
    out = _compile(dropout)(x, 0.3)
    kept = (out != 0) & ~out.isnan()
    expected = x.mul(torch.ones_like(x)).mul_(1.0 / 0.7)
    assert out.dtype == dtype
    torch.testing.assert_close(out[kept], expected[kept], rtol=0, atol=0)
    dropped = ~kept & x.isfinite()
    assert not out[dropped].any()
    assert out[0, :8].isnan().eq(~kept[0, :8]).all()
    _assert_on_device(1)


def test_masks_are_fresh_per_call_and_repeat_under_manual_seed():
    """One graph for every call (Dynamo's eager backend: one too, its mask on the host),
    a new mask each call, the same masks after the same ``torch.manual_seed``."""
    x = torch.ones(N)
    compiled = _compile(dropout)
    torch.manual_seed(3)
    first, second = compiled(x, 0.5), compiled(x, 0.5)
    torch.manual_seed(3)
    again = compiled(x, 0.5)
    assert not torch.equal(first, second)
    assert torch.equal(first, again)
    assert counters["stats"]["unique_graphs"] == 1
    # two masks of one call stream apart: agreement as for independent draws
    both = ((first != 0) & (second != 0)).sum()
    assert _within_binomial(int(both), N, 0.25)


def test_a_rate_passed_as_an_argument_is_never_worse_than_dynamos_default():
    """Dynamo's own trace pins a float that reaches F.dropout (its ATen op takes a
    constant): one graph per rate under both backends, each of simaccel's on the device,
    its rate read from the graph input."""
    x = torch.ones(N)
    graphs = {}
    for backend in ("simaccel", "eager"):
        compiled = _compile(dropout) if backend == "simaccel" else \
            torch.compile(dropout, backend="eager")
        if backend == "eager":
            torch._dynamo.reset()
            counters.clear()
        for p in (0.1, 0.5, 0.9):
            kept = int((compiled(x, p) != 0).sum())
            assert _within_binomial(kept, N, 1 - p), (backend, p, kept)
        graphs[backend] = counters["stats"]["unique_graphs"]
        if backend == "simaccel":
            _assert_on_device(3)
            assert "lifted" in simaccel.reports()[0].rewrites[0]
    assert graphs == {"simaccel": 3, "eager": 3}


def test_every_tier_hashes_the_same_bits():
    """Python ints, numpy arrays (tier-0 kernels), torch tensors (the op's eager form)
    and the compiled kernel give one another's bits."""
    seed, stream = 0x5DEECE66D1234567, 3
    index = np.arange(1000, dtype=np.int64)
    as_ints = [hash_lib.random_bits(int(i), seed, stream) for i in index]
    as_array = hash_lib.random_bits(index, np.int64(seed), stream)
    as_tensor = random_bits(torch.tensor(seed), [1000], stream)
    compiled = numba.njit(lambda i, s, k: hash_lib.random_bits(i, s, k))
    assert as_array.tolist() == as_ints == as_tensor.tolist()
    assert [compiled(int(i), seed, stream) for i in index] == as_ints
    assert 0 <= min(as_ints) and max(as_ints) < 1 << hash_lib.BITS


def _pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return F.dropout(x, 0.5, training=True), F.dropout(x, 0.5, training=True)


def test_each_dropout_of_a_graph_has_its_own_stream():
    a, b = _compile(_pair)(torch.ones(N))
    ka, kb = a != 0, b != 0
    assert _within_binomial(int((ka & kb).sum()), N, 0.25)
    # neighbours are independent too (the index is hashed, not added to the seed)
    assert _within_binomial(int((ka[1:] & ka[:-1]).sum()), N - 1, 0.25)
    _assert_on_device(2)


def test_gradients_use_the_forwards_mask():
    """The backward multiplies by the same mask and scale (AOTAutograd keeps it or
    recomputes it from the call's seed)."""
    torch.manual_seed(0)
    x = torch.randn(512, 256, requires_grad=True)
    weight = torch.randn(512, 256)

    def fn(x, weight):
        return (F.dropout(x, 0.2, training=True) * weight).sum(), F.dropout(x, 0.2)

    compiled = _compile(fn)
    loss, _ = compiled(x, weight)
    out, = torch.autograd.grad(loss, x)
    kept = out != 0
    assert _within_binomial(int(kept.sum()), x.numel(), 0.8)
    torch.testing.assert_close(out, weight * kept * (1 / 0.8), rtol=1e-6, atol=0)
    assert [r.graph.split("_")[1] for r in simaccel.reports()] == ["forward", "backward"]
    _assert_on_device(2)


@contextlib.contextmanager
def eager_with_seed(seed: torch.Tensor) -> Iterator[None]:
    """Eager's ``F.dropout`` as the device computes it for a call with ``seed``: active
    dropouts, in call order, are the graph's streams 0, 1, 2, ..."""
    real, streams = F.dropout, itertools.count()

    def device_dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        return hash_dropout(x, seed, p, next(streams))
    F.dropout = device_dropout
    try:
        yield
    finally:
        F.dropout = real


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_gpt2_training_step_keeps_its_dropouts_on_the_device(dtype):
    """7 dropouts (embeddings; attention weights and two residuals per layer, of 2
    layers: each layer's kernels are the same), forward and backward on the device;
    eager on the same masks gives the same loss and gradients."""
    model, (tokens,) = gpt2(n_layer=2)
    model = model.to(dtype).train()
    reference = gpt2(n_layer=2)[0].to(dtype).train()
    reference.load_state_dict(model.state_dict())
    compiled = _compile(model)
    torch.manual_seed(11)
    loss = compiled(tokens).float().square().mean()
    loss.backward()
    torch.manual_seed(11)
    with eager_with_seed(draw_seed()):
        expected = reference(tokens).float().square().mean()
    expected.backward()
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else \
        {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(loss, expected, **tol)
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad, **tol, msg=name)
    _assert_on_device(7)


class MCDropoutHead(nn.Module):
    """A Monte Carlo dropout head: dropout kept active at inference, as uncertainty
    estimates sample it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.dropout(x, 0.25, training=True)).relu()


def test_inference_with_an_active_dropout_over_dynamic_sizes():
    """No grad, sizes varying: one graph, each call's output as eager's on its masks."""
    model = MCDropoutHead()
    compiled = _compile(model, dynamic=True)
    with torch.no_grad():
        for rows in (8, 24, 40):
            x = torch.randn(rows, 64)
            torch.manual_seed(rows)
            out = compiled(x)
            torch.manual_seed(rows)
            with eager_with_seed(draw_seed()):
                torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1
    _assert_on_device(1)


def test_a_rate_of_one_drops_everything():
    out = _compile(dropout)(torch.randn(1000), 1.0)
    assert torch.equal(out, torch.zeros(1000))
    _assert_on_device(1)

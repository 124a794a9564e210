"""Hand-written softmax attention made one SDPA call before AOTAutograd
(:mod:`simaccel.attention_rewrite`), run by the fused attention kernel. Each case
compares with eager (``check``: values, dtype, shape, kernels launched, DMA moved, no host
fallback) and shows what ran: the rewrite in the compile report, one attention kernel and
no batched GEMM or softmax kernel of its own; near misses stay as written."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import simaccel
from simaccel.bench.gpt2 import gpt2
from simaccel.codegen.blas_symbols import has_gemm
from tests.conftest import check
from tests.models.eager_attention import (AdditiveMaskAttention, DropoutAttention,
                                          HFGPT2Attention, InfFillAttention,
                                          LlamaEagerAttention, PaddedAttention,
                                          SelectMaskAttention, WeightsReturnedAttention)

#: float32: the scale moved from the scores to q and the kernel's exps and sums rounded
#: as eager's flash kernel rounds them, not as its softmax does; float64 near exact
TOL = {torch.float32: {"rtol": 1e-5, "atol": 2e-6},
       torch.float64: {"rtol": 1e-12, "atol": 1e-13},
       torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}

pytestmark = pytest.mark.skipif(not has_gemm("float32"),
                                reason="this torch exports no BLAS GEMM")


def _qkv(*shape: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(*shape, dtype=dtype) for _ in range(3)]


def _rewrites(result) -> list[str]:
    return [line for r in result.reports for line in r.rewrites]


def _assert_fused(result, count: int = 1) -> None:
    """``count`` attentions rewritten, each one kernel: no batched GEMM or softmax row
    kernel is left."""
    assert len(_rewrites(result)) == count, _rewrites(result)
    names = [k.name for r in result.reports for k in r.kernels]
    assert sum("flash_attention" in n and n.startswith("extern") for n in names) == count
    assert not [n for n in names if "bmm" in n or "amax" in n], names


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_select_mask_attention_runs_as_one_kernel(dtype):
    q, k, v = _qkv(2, 4, 64, 32, dtype=dtype)
    result = check(SelectMaskAttention(factor=0.7).to(dtype), q, k, v, **TOL[dtype])
    _assert_fused(result)
    assert f"where(..., {torch.finfo(dtype).min:.3g})" in _rewrites(result)[0]


def test_a_lifted_factor_changes_without_a_recompile():
    """The config factor is lifted: it multiplies q at run time, so new values reuse the
    graph (Dynamo's eager backend, on the same calls, compiles again)."""
    q, k, v = _qkv(1, 2, 16, 8)
    model = SelectMaskAttention(positions=16)
    graphs = {}
    for backend in ("simaccel", "eager"):
        torch._dynamo.reset()
        counters.clear()
        simaccel.clear_reports()  # the reports of this compile only, not an earlier test's
        compiled = torch.compile(model, backend=backend)
        for factor in (1.0, 0.5, 3.0):
            model.factor = factor
            torch.testing.assert_close(compiled(q, k, v), model(q, k, v), **TOL[q.dtype])
        graphs[backend] = counters["stats"]["unique_graphs"]
        if backend == "simaccel":
            (report,) = simaccel.reports()
    assert graphs["simaccel"] == 1 < graphs["eager"]
    assert "*" in report.rewrites[0]  # a factor read from the graph


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_row_hidden_whole_gets_uniform_weights_as_in_eager(dtype):
    """The finite fill makes every score of a hidden row equal: uniform weights, the
    mean of the values (the kernel keeps the row's keys rather than skipping them)."""
    q, k, v = _qkv(1, 2, 8, 4, dtype=dtype)
    model = SelectMaskAttention(positions=8)
    model.bias[..., 3, :] = False
    result = check(model, q, k, v, **TOL[dtype])
    _assert_fused(result)
    torch.testing.assert_close(result.outputs[0, :, 3], v[0].mean(dim=1), **TOL[dtype])


def test_an_additive_mask_before_the_scores():
    q, k, v = _qkv(2, 2, 24, 16)
    lengths = torch.tensor([24, 17])
    keep = (torch.arange(24) < lengths[:, None])[:, None, None, :] \
        & torch.ones(24, 24, dtype=torch.bool).tril()
    mask = torch.zeros(2, 1, 24, 24).masked_fill(~keep, torch.finfo(torch.float32).min)
    _assert_fused(check(AdditiveMaskAttention(), q, k, v, mask, **TOL[torch.float32]))


def test_a_select_and_an_additive_mask_in_one_chain():
    q, k, v = _qkv(2, 2, 12, 8)
    hidden = torch.zeros(2, 1, 1, 12, dtype=torch.bool)
    hidden[1, ..., 9:] = True
    causal = torch.zeros(12, 12).masked_fill(torch.ones(12, 12).triu(1).bool(), -1e30)
    result = check(PaddedAttention(), q, k, v, hidden, causal, **TOL[torch.float32])
    _assert_fused(result)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_hidden_whole_by_minus_inf_are_nan_as_in_eager(dtype):
    """A -inf fill (nanoGPT) or an added -inf mask hides a row whole: eager's softmax
    gives NaN there, so the rewritten attention does too; the other rows are equal."""
    q, k, v = _qkv(2, 2, 8, 4, dtype=dtype)
    hidden = torch.ones(8, 8, dtype=torch.bool).triu(1)
    hidden[5] = True
    result = check(InfFillAttention(), q, k, v, hidden, **TOL[dtype])
    _assert_fused(result)
    assert result.outputs[:, :, 5].isnan().all() and not result.outputs[:, :, 4].isnan().any()
    mask = torch.zeros(2, 1, 8, 8, dtype=dtype).masked_fill(hidden, float("-inf"))
    result = check(AdditiveMaskAttention(), q, k, v, mask, **TOL[dtype])
    _assert_fused(result)
    assert result.outputs[:, :, 5].isnan().all()


def _small_fill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """An old-style -1e4 fill: added to the scores it would shift them, not hide them."""
    hidden = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
    return (q @ k.transpose(-1, -2)).masked_fill(hidden, -1e4).softmax(-1) @ v


@pytest.mark.parametrize("model", [WeightsReturnedAttention(), DropoutAttention().train(),
                                   _small_fill])
def test_near_misses_stay_as_written(model):
    """Weights returned, an active dropout, a small fill: no attention rewrite, and the
    graph still runs on the device (a dropout's values are random: shapes only)."""
    args = _qkv(1, 2, 8, 4)
    q = args[0]
    if isinstance(model, DropoutAttention):
        simaccel.clear_reports()
        torch._dynamo.reset()
        simaccel.get_device().reset_stats()
        assert torch.compile(model, backend="simaccel")(*args).shape == q.shape
        assert simaccel.get_device().runtime_stats()["kernel_launches"] > 0
        reports = simaccel.reports()
        # the dropout runs on the device too (simaccel.dropout_rng), as its own rewrite
        assert not [f for r in reports for f in r.host_fallbacks]
        assert [line.split()[0] for r in reports for line in r.rewrites] == ["dropout"]
        return
    reports = check(model, *args, **TOL[torch.float32]).reports
    assert reports and not [line for r in reports for line in r.rewrites]


def test_an_inactive_dropout_is_rewritten():
    q, k, v = _qkv(1, 2, 8, 4)
    _assert_fused(check(DropoutAttention().eval(), q, k, v, **TOL[torch.float32]))


def test_gradients_flow_through_the_rewritten_attention():
    """Training graphs get the rewrite too: the fused forward and SDPA's backward."""
    q, k, v = (t.requires_grad_() for t in _qkv(2, 2, 16, 8))
    model = SelectMaskAttention(positions=16, factor=0.5)
    reference = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    torch._dynamo.reset()
    simaccel.clear_reports()
    simaccel.get_device().reset_stats()
    out = torch.compile(model, backend="simaccel")(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 0
    assert [r.graph.split("_")[1] for r in simaccel.reports()] == ["forward", "backward"]
    expected = model(*reference)
    torch.testing.assert_close(out, expected, **TOL[torch.float32])
    for got, want in zip(grads, torch.autograd.grad(expected.square().sum(), reference)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert simaccel.reports()[0].rewrites


def test_dynamic_lengths_share_one_rewritten_graph():
    model = SelectMaskAttention(positions=64)
    torch._dynamo.reset()
    counters.clear()
    simaccel.clear_reports()
    compiled = torch.compile(model, backend="simaccel", dynamic=True)
    for length in (16, 24, 40):
        q, k, v = _qkv(1, 2, length, 8)
        torch.testing.assert_close(compiled(q, k, v), model(q, k, v), **TOL[torch.float32])
    assert counters["stats"]["unique_graphs"] == 1
    report = simaccel.reports()[0]
    assert report.size_symbols and report.rewrites  # one graph for every length


def test_gpt2_layers_run_fused_attention_on_a_biased_qkv_gemm():
    """Each layer's attention is rewritten; its fused qkv projection, whose q, k and v
    the kernel reads in place, adds its bias in the GEMM (no copy kernel per operand)."""
    model, (tokens,) = gpt2(n_layer=2, batch=2, seq=16)
    with torch.no_grad():  # logits through 2 layers and a 512-way head: sums of sums
        result = check(model, tokens, rtol=1e-4, atol=2e-5)
    _assert_fused(result, count=2)
    paths = [k.path for k in result.reports[0].kernels if k.name.startswith("gemm")]
    assert paths.count("gemm_bias") == 2, paths  # c_attn of each layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hugging_face_gpt2_attention_as_written(dtype):
    q, k, v = _qkv(2, 3, 32, 16, dtype=dtype)
    result = check(HFGPT2Attention().eval().to(dtype), q, k, v, **TOL[dtype])
    _assert_fused(result)
    # the torch.full divisor folded into the kernel's scale: 1 / sqrt(16), no q kernel
    assert "* 0.25 " in _rewrites(result)[0] and "/ " not in _rewrites(result)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_eager_attention_with_a_float32_softmax(dtype):
    q, k, v = _qkv(1, 4, 20, 16, dtype=dtype)
    causal = torch.full((20, 20), torch.finfo(dtype).min, dtype=dtype).triu(1)
    result = check(LlamaEagerAttention(16 ** -0.5).eval(), q, k, v,
                   causal[None, None], **TOL[dtype])
    _assert_fused(result)


def test_a_wide_qkv_projection_adds_its_bias_in_the_inner_product(monkeypatch):
    """A qkv projection of at least ``ONEDNN_PLAIN_MIN_MACS`` multiply-adds whose k and v the
    attention kernel reads in place: oneDNN's inner product adds the bias (one call)."""
    from simaccel.codegen import library
    biases = []
    primitive = library._ONEDNN_LINEAR
    if primitive is None:
        pytest.skip("this torch has no oneDNN")
    monkeypatch.setattr(library, "_ONEDNN_LINEAR",
                        lambda *a: biases.append(a[2] is not None) or primitive(*a))
    torch.manual_seed(0)
    qkv = torch.nn.Linear(512, 3 * 512).eval()

    def attention(x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(1, 64, 8, 64).transpose(1, 2) for t in qkv(x).split(512, -1))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    with torch.no_grad():
        result = check(attention, torch.randn(1, 64, 512), rtol=1e-4, atol=1e-5)
    assert [k.path for k in result.reports[0].kernels if k.name.startswith("gemm")] \
        == ["gemm_bias"]
    assert biases and all(biases)


def test_gpt2_under_bfloat16_autocast_is_rewritten_and_no_less_accurate():
    """Mixed precision: under CPU autocast the qkv projection gives bfloat16 q, k and v
    and the softmax runs in float32 (autocast's policy); the rewrite takes it, and the
    fused kernel (float32 scores and weights, the output rounded once) is no further from
    the float32 model than eager's autocast forward is."""
    model, (tokens,) = gpt2(n_layer=2, batch=2, seq=16)
    torch._dynamo.reset()
    simaccel.clear_reports()
    compiled = torch.compile(model, backend="simaccel")
    with torch.no_grad():
        exact = model(tokens)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, eager = compiled(tokens), model(tokens)
    assert got.dtype == eager.dtype == torch.bfloat16
    # logits up to ~100, where a bfloat16 ulp is 0.5: within 2 ulp of eager's
    torch.testing.assert_close(got.float(), eager.float(), rtol=2e-2, atol=1.0)
    device_err, eager_err = ((t.float() - exact).abs() for t in (got, eager))
    assert device_err.mean() <= eager_err.mean() * 1.05, (device_err.mean(), eager_err.mean())
    assert len(simaccel.reports()[-1].rewrites) == 2
    assert not simaccel.reports()[-1].host_fallbacks

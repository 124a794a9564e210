"""Row fusion (:mod:`simaccel.codegen.fusion_rows`): a reduction and the kernels that read
its result row by row run as one row kernel, with eager's values.

Each case compares with eager (``check``: dtype, shape, values at the stated tolerance,
kernels launched, DMA moved, no host fallback) and says which kernels ran. A case that
must not fuse (a row reads another row's result) proves the check that keeps rows
independent.
"""
from __future__ import annotations

import math
import pathlib

import pytest
import torch
import torch.nn.functional as F

import simaccel
from simaccel.codegen import emit_rows
from simaccel.codegen.fusion_rows import flat_offset
from simaccel.codegen.row_reuse import RowReuse
from tests.conftest import REDUCTION_TOL, check

#: softmax and normalisation rows: sums of up to 256 terms, reordered (float32)
ROW_TOL = {"rtol": 1e-4, "atol": 1e-5}


def _kinds(result) -> list[str]:
    kinds = [k.kind for r in result.reports for k in r.kernels]
    assert result.runtime_stats["kernel_launches"] == len(kinds)
    return kinds


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


@pytest.mark.parametrize("name, fn, make", [
    ("softmax", lambda x: torch.softmax(x, -1), lambda: (torch.randn(64, 96) * 3,)),
    ("log_softmax", lambda x: torch.log_softmax(x, -1), lambda: (torch.randn(8, 16, 40),)),
    ("layer_norm_gelu", lambda x, w, b: F.gelu(F.layer_norm(x, (256,), w, b)),
     lambda: (torch.randn(24, 256), torch.randn(256), torch.randn(256))),
    ("rms_norm", rms_norm, lambda: (torch.randn(4, 10, 64), torch.randn(64))),
    ("masked_softmax", lambda x, m: torch.softmax(x.masked_fill(m, -math.inf), -1),
     lambda: (torch.randn(6, 32), torch.arange(32) > 20)),
])
def test_row_ops_are_one_row_kernel(name, fn, make):
    result = check(fn, *make(), **ROW_TOL)
    assert _kinds(result) == ["row"], name


@pytest.mark.usefixtures("without_fused_attention")
@pytest.mark.parametrize("keys, kinds", [
    (64, ["library", "row", "library"]),  # short rows: scores GEMM, softmax row, GEMM
    (256, ["library"]),  # long rows: the fused library call (skips masked blocks)
])
def test_static_causal_attention_takes_the_gemm_pair_or_the_fused_call_by_length(keys, kinds):
    from simaccel.attention import GEMM_PAIR_MAX_KEYS
    assert (keys <= GEMM_PAIR_MAX_KEYS) == (len(kinds) == 3)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, keys, 32) for _ in range(3))
    result = check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                   q, k, v, rtol=1e-4, atol=1e-5)
    assert _kinds(result) == kinds


@pytest.mark.usefixtures("without_fused_attention")
@pytest.mark.parametrize("batch, dim", [((1, 2), 32), ((4, 8), 64)])
def test_causal_self_attention_of_128_runs_as_two_key_halves(batch, dim):
    """At SPLIT_MIN_KEYS (static, equal query and key lengths) causal attention skips the
    masked quarter: block a (every query, the first half of keys) and block b (the last
    half of both), each a GEMM, one row kernel (its max, exps and their sum, each exp
    computed once and stored for the GEMM) and a GEMM, then one pointwise kernel that
    combines the blocks; forward and backward equal eager. At ``host_map_min_bytes`` per
    operand, key and value are read in place: each half by its own GEMM (the query, read 1.5 times, is
    copied)."""
    from simaccel.attention import SPLIT_MIN_KEYS
    torch.manual_seed(0)
    q, k, v = (torch.randn(*batch, SPLIT_MIN_KEYS, dim, requires_grad=True) for _ in range(3))
    result = check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                   q.detach(), k.detach(), v.detach(), rtol=1e-4, atol=1e-5)
    assert _kinds(result) == ["library", "row", "library"] * 2 + ["pointwise"]
    min_bytes = simaccel.get_device().config.host_map_min_bytes
    mapped = 2 * k.numel() * 4 if k.numel() * 4 >= min_bytes else 0
    assert result.dma_stats["h2d.mapped_bytes"] == mapped  # k and v, one call
    rows = [k for r in result.reports for k in r.kernels if k.kind == "row"]
    assert all(pathlib.Path(row.path).read_text().count("lib.vexp(") == 1 for row in rows)
    torch._dynamo.reset()

    def loss(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum()
    got = torch.autograd.grad(torch.compile(loss, backend="simaccel")(q, k, v), (q, k, v))
    for g, e in zip(got, torch.autograd.grad(loss(q, k, v), (q, k, v))):
        torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-4)


@pytest.mark.usefixtures("without_fused_attention")
@pytest.mark.parametrize("shape, dtype", [
    ((1, 2, 126, 32), torch.float32),  # shorter than SPLIT_MIN_KEYS
    ((1, 2, 128, 32), torch.bfloat16),  # bfloat16 rounds the halves' sum once more
])
def test_other_causal_attention_keeps_the_single_gemm_pair(shape, dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(*shape).to(dtype) for _ in range(3))
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    result = check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                   q, k, v, **tol)
    kinds = [kern.kind for r in result.reports for kern in r.kernels]
    assert kinds.count("library") == 2 and kinds.count("row") == 1  # the one pair


@pytest.mark.usefixtures("without_fused_attention")
def test_dynamic_length_attention_softmax_is_one_row_kernel_between_the_gemms():
    torch.manual_seed(0)
    torch._dynamo.reset()
    simaccel.clear_reports()
    fn = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                       backend="simaccel", dynamic=True)
    for length in (24, 40, 56):
        q, k, v = (torch.randn(2, 4, length, 32) for _ in range(3))
        torch.testing.assert_close(
            fn(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True),
            rtol=1e-3, atol=1e-4)
    # scores = q @ k^T, then per row: mask and scale, max, sum of exp, the weights
    assert [k.kind for r in simaccel.reports() for k in r.kernels] == \
        ["library", "row", "library"]
    # the softmax is written exp(s - max) / sum: its row kernel computes each exp once
    row = next(k for r in simaccel.reports() for k in r.kernels if k.kind == "row")
    assert pathlib.Path(row.path).read_text().count("lib.vexp(") == 1


@pytest.mark.usefixtures("without_fused_attention")
@pytest.mark.parametrize("dynamic, lengths, fused", [
    (False, (32, 48), False), (True, (32, 48), False),  # the GEMM pair, its rows fused
    (False, (160, 192), True),  # keys past GEMM_PAIR_MAX_KEYS: the fused library ops
])
def test_attention_backward_matches_eager(dynamic, lengths, fused):
    torch.manual_seed(0)

    def loss(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum()
    torch._dynamo.reset()
    simaccel.clear_reports()
    compiled = torch.compile(loss, backend="simaccel", dynamic=dynamic)
    for length in lengths:
        q, k, v = (torch.randn(2, 2, length, 16, requires_grad=True) for _ in range(3))
        grads = torch.autograd.grad(loss(q, k, v), (q, k, v))
        got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
        for g, e in zip(got, grads):
            torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-4)
    kinds = [kern.kind for r in simaccel.reports() for kern in r.kernels]
    assert ("row" in kinds) == (not fused) and "library" in kinds
    assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 0


def test_row_fusion_with_a_dynamic_batch():
    fn = torch.compile(lambda x, w, b: F.layer_norm(x, (48,), w, b), backend="simaccel",
                       dynamic=True)
    w, b = torch.randn(48), torch.randn(48)
    torch._dynamo.reset()
    simaccel.clear_reports()
    for rows in (3, 17, 40):
        x = torch.randn(rows, 48)
        torch.testing.assert_close(fn(x, w, b), F.layer_norm(x, (48,), w, b), **ROW_TOL)
    kinds = [k.kind for r in simaccel.reports() for k in r.kernels]
    assert kinds == ["row"]  # one graph for every batch, one row kernel


def test_bfloat16_layer_norm_is_one_row_kernel():
    x = torch.randn(16, 128).to(torch.bfloat16)
    w, b = torch.randn(128).to(torch.bfloat16), torch.randn(128).to(torch.bfloat16)
    # eager rounds the normalised row to bfloat16 in its own steps: 2 bf16 ulps
    result = check(lambda x, w, b: F.layer_norm(x, (128,), w, b), x, w, b,
                   rtol=1.6e-2, atol=2e-2)
    assert _kinds(result) == ["row"]


def test_a_row_reading_another_rows_result_is_not_fused():
    x = torch.randn(16, 32)
    # each row is divided by the next row's sum: fusing would read a sum not yet stored
    result = check(lambda x: x / x.sum(-1, keepdim=True).roll(1, 0), x, **REDUCTION_TOL)
    assert "row" not in _kinds(result)


def test_a_reduction_over_a_different_extent_is_not_a_row_stage():
    x = torch.randn(16, 32)
    result = check(lambda x: (x - x.mean(-1, keepdim=True)).sum(0), x, **REDUCTION_TOL)
    assert "row" not in _kinds(result)


def test_flat_offset_recognises_one_position_per_row():
    assert flat_offset("o0*32 + o1*16 + o2", ("o0", "o1", "o2"), ("1", "2", "16")) == \
        ("0", "1")
    # a collapsed dim read through // and %: the same element per row
    assert flat_offset("(i0 // 8)*1024 + ((i0) % 8)*128 + i1", ("i0", "i1"),
                       ("32", "128")) == ("0", "1")
    assert flat_offset("i0*64 + 5", ("i0",), ("7",)) == ("5", "64")
    # not a sum of one-variable terms: checked at every position
    assert flat_offset("(i0*8 + i1) % 64", ("i0", "i1"), ("4", "8")) == ("0", "1")
    assert flat_offset("i0*i1", ("i0", "i1"), ("4", "8")) is None
    assert flat_offset("o0*s0 + o1", ("o0", "o1"), ("s1", "s0")) == ("0", "1")
    assert flat_offset("(i0 // 4)*(4*s0*s0) + ((i0) % 4)*(s0*s0) + i1*s0", ("i0", "i1"),
                       ("8", "s0")) == ("0", "s0")
    assert flat_offset("(i0 // 4)*(4*s0) + ((i0) % 4)*(s0*s0)", ("i0",), ("8",)) is None
    # not one position per row: a transposed read, another loop variable, a call
    assert flat_offset("i1*4 + i0", ("i0", "i1"), ("4", "8")) is None
    assert flat_offset("o0*32 + r0", ("o0",), ("8",)) is None
    assert flat_offset("ModularIndexing(o0, 1, 4)", ("o0",), ("8",)) is None


def _row_source(result) -> str:
    paths = [k.path for r in result.reports for k in r.kernels if k.kind == "row"]
    assert len(paths) == 1
    return pathlib.Path(paths[0]).read_text()


@pytest.mark.parametrize("transposed", [False, True])
def test_a_softmax_row_computes_its_exp_once_per_element(transposed):
    """The sum pass stores exp(x - max) into the output, the output pass divides it in
    place (:mod:`simaccel.codegen.row_reuse`); masked scores (-inf) exp to 0. Over a
    transposed input too: a row's elements are then strided in memory."""
    torch.manual_seed(0)
    x = torch.randn(4, 8, 64, 48) * 4
    mask = torch.rand(4, 8, 64, 48) < 0.3

    def masked_softmax(x, mask):
        x = x.transpose(-1, -2) if transposed else x
        mask = mask.transpose(-1, -2) if transposed else mask
        return torch.softmax((x * 0.125).masked_fill(mask, -math.inf), -1)
    result = check(masked_softmax, x, mask, **ROW_TOL)
    source = _row_source(result)
    assert source.count("lib.vexp(") == 1, source
    assert _kinds(result) == ["row"]


def test_a_16_bit_softmax_recomputes_its_exp():
    """A bfloat16 output would round the stored exp: the output pass computes its own."""
    x = (torch.randn(32, 96) * 3).to(torch.bfloat16)
    result = check(lambda x: torch.softmax(x, -1), x, rtol=1.6e-2, atol=4e-3)
    assert _row_source(result).count("lib.vexp(") == 2


def test_the_reused_value_equals_the_recomputed_one_bit_for_bit(monkeypatch):
    """The rewrite changes where exp(x - max) comes from, never its value: the same
    kernel emitted without it gives the same bits."""
    x = torch.randn(64, 200) * 5
    mask = torch.rand(64, 200) < 0.2

    def fn(x, mask):
        return torch.softmax(x.masked_fill(mask, torch.finfo(x.dtype).min), -1)
    reused = check(fn, x, mask, **ROW_TOL)
    monkeypatch.setattr(emit_rows, "plan_reuse", lambda k: RowReuse({}, {}))
    recomputed = check(fn, x, mask, **ROW_TOL)
    assert _row_source(reused).count("lib.vexp(") == 1
    assert _row_source(recomputed).count("lib.vexp(") == 2
    assert torch.equal(reused.outputs, recomputed.outputs)


@pytest.mark.parametrize("width, fn, opaque", [
    (64, lambda x: x.amax(-1), True), (16, lambda x: x.amin(-1), True),
    (128, lambda x: x.amax(-1), False),  # LLVM vectorises a long loop as it is
    (64, lambda x: x.sum(-1), False),  # a sum survives LLVM's full unroll
])
def test_a_short_max_or_min_loop_hides_its_extent_from_llvm(width, fn, opaque):
    """simaccel.codegen.loop_lib: the kernel equals eager, NaN rows included."""
    torch.manual_seed(0)
    x = torch.randn(300, width)
    x[7, width // 2] = math.nan
    result = check(fn, x, rtol=1e-5, atol=1e-5)  # NaNs compare equal
    kernels = [k for r in result.reports for k in r.kernels]
    assert len(kernels) == 1
    assert ("lib.opaque_extent(" in pathlib.Path(kernels[0].path).read_text()) == opaque

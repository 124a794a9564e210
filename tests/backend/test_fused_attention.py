"""The fused attention kernel (:mod:`simaccel.codegen.templates_attention`): CPU flash
attention's forward as one parallel kernel calling the device's BLAS GEMM per block of
query rows. Each case compares with eager (``check``: values, dtype, shape, kernels
launched, DMA moved, no host fallback) and shows the one kernel ran; backward goes
through the logsumexp the kernel stores."""
from __future__ import annotations

import ctypes
import functools
import os
import pathlib
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import simaccel
from simaccel.codegen import templates_attention
from simaccel.codegen.blas_symbols import has_gemm
from tests.conftest import check

#: float32: sums of up to 128 exps and GEMMs of 64 terms, as eager's op orders them
#: closely but not exactly; float64 near exact
TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-6},
       torch.float64: {"rtol": 1e-12, "atol": 1e-13}}

pytestmark = pytest.mark.skipif(not has_gemm("float32"),
                                reason="this torch exports no BLAS GEMM")


def _sdpa(causal: bool):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _kinds(result) -> list[str]:
    return [k.kind for r in result.reports for k in r.kernels]


def _gradients(loss, inputs: list[torch.Tensor]) -> tuple[tuple, tuple]:
    """(simaccel's, eager's) gradients of ``loss`` at ``inputs`` (leaf tensors), compiled
    in a fresh Dynamo with the reports cleared."""
    reference = [t.detach().clone().requires_grad_() for t in inputs]
    torch._dynamo.reset()
    simaccel.clear_reports()
    got = torch.autograd.grad(torch.compile(loss, backend="simaccel")(*inputs), inputs)
    return got, torch.autograd.grad(loss(*reference), reference)


@pytest.mark.parametrize("q_shape, kv_shape, causal, dtype", [
    ((4, 8, 128, 64), (4, 8, 128, 64), True, torch.float32),  # the bench's shape
    ((2, 3, 37, 16), (2, 3, 37, 16), True, torch.float64),  # a partial last block
    ((2, 2, 5, 8), (2, 2, 9, 8), True, torch.float32),  # causal, fewer queries than keys
    ((1, 2, 300, 8), (1, 2, 70, 8), True, torch.float32),  # more queries: 64-row blocks
    ((2, 3, 33, 16), (2, 3, 7, 16), False, torch.float32),
    ((1, 1, 1, 4), (1, 1, 1, 4), False, torch.float64),  # one row, one key
])
def test_fused_attention_equals_eager_in_one_kernel(q_shape, kv_shape, causal, dtype):
    torch.manual_seed(0)
    q = torch.randn(*q_shape, dtype=dtype)
    k, v = (torch.randn(*kv_shape, dtype=dtype) for _ in range(2))
    result = check(_sdpa(causal), q, k, v, **TOL[dtype])
    assert _kinds(result) == ["extern"]
    kernel = result.reports[-1].kernels[0]
    assert "gemm(" in pathlib.Path(kernel.path).read_text()


def test_query_key_and_value_are_read_in_place_once():
    """One kernel reads each operand once per (batch, head): each is read across the bus
    in place (1 MiB, above the host-mapping threshold), nothing is copied."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 8, 128, 64) for _ in range(3))
    result = check(_sdpa(True), q, k, v, **TOL[torch.float32])
    assert result.dma_stats["h2d.mapped_bytes"] == 3 * q.numel() * 4


def test_heads_split_from_a_projection_are_read_without_a_copy():
    """q, k, v as a model makes them (a (batch, length, heads, dim) projection transposed
    to (batch, heads, length, dim)): the kernel reads the strided rows in place, and its
    output is laid out as eager's, so transposing it back is a view."""
    torch.manual_seed(0)
    x = torch.randn(2, 40, 3 * 4 * 16)
    w = torch.randn(3 * 4 * 16, 3 * 4 * 16) / 8

    def attention(x, w):
        q, k, v = (x @ w).view(2, 40, 3, 4, 16).unbind(2)
        out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                             is_causal=True)
        return out.transpose(1, 2).reshape(2, 40, 64)
    result = check(attention, x, w, rtol=1e-4, atol=1e-5)
    assert _kinds(result) == ["library", "extern"]  # the projection, then attention


@pytest.mark.parametrize("causal", [True, False])
def test_fused_attention_gradients_equal_eager(causal):
    """The backward reads the logsumexp the kernel stored (static shapes: the GEMM
    decomposition of simaccel.attention)."""
    torch.manual_seed(0)
    inputs = [torch.randn(2, 2, 48, 16, requires_grad=True) for _ in range(3)]
    got, want = _gradients(lambda *a: _sdpa(causal)(*a).square().sum(), inputs)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    assert "extern" in [k.kind for r in simaccel.reports() for k in r.kernels]
    assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 0


@pytest.mark.parametrize("mask, dropout, dtype, shape, takes", [
    (None, 0.0, "float32", (2, 4, 8, 8), True),
    ((8, 8), 0.0, "float32", (2, 4, 8, 8), True),  # an additive mask, broadcast
    ((2, 1, 1, 8), 0.0, "float64", (2, 4, 8, 8), True),  # a padding mask
    ((3, 1, 8, 8), 0.0, "float32", (2, 4, 8, 8), False),  # batch 3 against 2
    ((1, 2, 4, 8, 8), 0.0, "float32", (2, 4, 8, 8), False),  # 5-D
    (None, 0.1, "float32", (2, 4, 8, 8), False),
    (None, 0.0, "bfloat16", (2, 4, 8, 8), True),  # computed in float32
    (None, 0.0, "int32", (2, 4, 8, 8), False),  # no integer GEMM
    (None, 0.0, "float32", (4, 8, 8), False),  # 3-D
])
def test_what_the_fused_kernel_takes(mask, dropout, dtype, shape, takes):
    shapes = [shape, shape, shape] + ([mask] if mask else [])
    assert templates_attention.fused_attention_takes(shapes, [dtype] * len(shapes),
                                                     dropout) is takes


@pytest.mark.parametrize("length, causal, batch_heads, rows", [
    (128, True, 32, 32), (512, True, 32, 64),  # causal: small blocks skip masked keys
    (128, False, 32, 128), (1024, False, 8, 128),  # not causal: fewer, larger GEMMs
    (128, False, 1, 32), (128, False, 2, 64)])  # ... but at least MIN_TASKS tasks
def test_query_rows_per_task(length, causal, batch_heads, rows):
    assert templates_attention.query_block(length, causal, batch_heads) == rows


@pytest.mark.parametrize("kv_heads, takes", [(2, True), (3, False)])
def test_grouped_query_attention_is_taken_where_the_heads_divide(kv_heads, takes):
    shapes = [(2, 8, 16, 8)] + [(2, kv_heads, 16, 8)] * 2
    assert templates_attention.fused_attention_takes(shapes, ["float32"] * 3, 0.0) is takes


def _gqa(causal: bool):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                          enable_gqa=True)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_grouped_query_attention_equals_eager_forward_and_backward(causal, fused,
                                                                   monkeypatch):
    """``enable_gqa``: 2 key/value heads serve 8 query heads (4 consecutive each). The
    fused kernel reads each key head for its group; the decomposition (a torch without
    BLAS symbols) repeats them, and its backward sums each group's gradients."""
    if not fused:
        monkeypatch.setattr(templates_attention, "has_gemm", lambda dtype: False)
    torch.manual_seed(0)
    q = torch.randn(2, 8, 40, 16)
    k, v = (torch.randn(2, 2, 40, 16) for _ in range(2))
    result = check(_gqa(causal), q, k, v, **TOL[torch.float32])
    assert (_kinds(result) == ["extern"]) is fused
    got, want = _gradients(lambda *a: _gqa(causal)(*a).square().sum(),
                           [t.clone().requires_grad_() for t in (q, k, v)])
    for g, e in zip(got, want):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype, mask_dtype, takes", [
    ("float32", "float64", False), ("bfloat16", "float32", True),  # eager takes both
    ("bfloat16", "float64", False)])
def test_a_mask_of_the_operands_or_their_compute_dtype_is_taken(dtype, mask_dtype, takes):
    shapes = [(2, 4, 8, 8)] * 3 + [(8, 8)]
    dtypes = [dtype] * 3 + [mask_dtype]
    assert templates_attention.fused_attention_takes(shapes, dtypes, 0.0) is takes


#: one unit in the last place, relative: bfloat16 keeps 8 significant bits, float16 11
HALF_ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("masked", [False, True])
def test_half_attention_runs_in_float32_and_rounds_once(dtype, masked):
    """16-bit q, k, v are converted as they are read, attention runs in the float32
    kernel and the output is rounded once: within one unit in the last place of the
    float32 result (eager's op also rounds the weights before their GEMM), and close to
    eager's output at the 16-bit tolerance."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 16, dtype=dtype) for _ in range(3))
    mask = _masks(2, 3, 40, 40)["padding"] if masked else None
    sdpa = functools.partial(F.scaled_dot_product_attention, attn_mask=mask,
                             is_causal=not masked)
    result = check(sdpa, q, k, v, rtol=1.6e-2, atol=1e-2)
    assert "extern" in _kinds(result)
    exact = sdpa(q.float(), k.float(), v.float())
    torch.testing.assert_close(result.outputs.float(), exact, rtol=HALF_ULP[dtype], atol=1e-5)


def test_bfloat16_attention_gradients_are_as_close_to_float32_as_eagers():
    """The backward of the float32 forward: computed in float32 from its float32
    logsumexp, each gradient rounded once; no further from the float32 gradients than
    twice eager's distance plus a tenth of bfloat16's tolerance."""
    torch.manual_seed(0)
    inputs = [torch.randn(2, 2, 24, 16, dtype=torch.bfloat16, requires_grad=True)
              for _ in range(3)]

    def loss(q, k, v):
        return _sdpa(True)(q, k, v).float().square().sum()
    got, want = _gradients(loss, inputs)
    as_float = [t.detach().float().requires_grad_() for t in inputs]
    exact = torch.autograd.grad(loss(*as_float), as_float)
    for g, e, x in zip(got, want, exact):
        assert g.dtype == torch.bfloat16
        assert (g.float() - x).abs().max() <= 2 * (e.float() - x).abs().max() + 1.6e-3
    assert "extern" in [k.kind for r in simaccel.reports() for k in r.kernels]


def _masked_sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _masks(batch: int, heads: int, length: int, keys: int) -> dict:
    """Masks as models pass them: boolean (SDPA turns it additive before the op, one
    small pointwise kernel), additive biases, broadcast or full, with a row masked whole
    (a padded query)."""
    torch.manual_seed(1)
    whole_row = (torch.rand(length, keys) > 0.3) | torch.eye(length, keys, dtype=torch.bool)
    whole_row[3] = False
    keep = torch.ones(batch, 1, 1, keys, dtype=torch.bool)
    keep[0, ..., keys - 5:] = False  # the first sequence padded by 5 keys
    slopes = torch.arange(1, heads + 1).view(1, heads, 1, 1) / heads
    distance = torch.arange(keys).view(1, keys) - torch.arange(length).view(length, 1)
    return {"bool, a row masked whole": whole_row, "padding": keep,
            "bool per head": torch.rand(batch, heads, length, keys) > 0.5,
            "additive per batch": torch.randn(batch, 1, length, keys),
            "ALiBi bias": -slopes * distance.abs()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", list(_masks(2, 3, 37, 45)))
def test_masked_attention_equals_eager_in_the_fused_kernel(kind, dtype):
    """The mask is read in place (broadcast dims by stride 0) and added to the tile's
    scores; a row masked whole returns 0 as eager's op does."""
    torch.manual_seed(0)
    mask = _masks(2, 3, 37, 45)[kind]
    mask = mask if mask.dtype == torch.bool else mask.to(dtype)
    q = torch.randn(2, 3, 37, 16, dtype=dtype)
    k, v = (torch.randn(2, 3, 45, 16, dtype=dtype) for _ in range(2))
    result = check(_masked_sdpa, q, k, v, mask, **TOL[dtype])
    # a boolean mask becomes additive in one pointwise kernel, then the one attention kernel
    assert _kinds(result)[-1:] == ["extern"] and len(_kinds(result)) <= 2
    source = pathlib.Path(result.reports[-1].kernels[-1].path).read_text()
    assert "gemm(" in source and "mask[" in source


def test_masked_attention_gradients_equal_eager():
    """The backward reads the logsumexp the masked kernel stored (0 for the row masked
    whole, whose gradients are 0)."""
    torch.manual_seed(0)
    mask = _masks(2, 2, 24, 24)["bool, a row masked whole"]
    inputs = [torch.randn(2, 2, 24, 16, requires_grad=True) for _ in range(3)]
    got, want = _gradients(lambda q, k, v: _masked_sdpa(q, k, v, mask).square().sum(), inputs)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    assert "extern" in [k.kind for r in simaccel.reports() for k in r.kernels]
    assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 0


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("form", ["bool key padding", "-inf per query", "minimum per query"])
def test_a_padding_masks_padded_keys_are_left_out_of_the_block(form, side):
    """A padding mask's padded keys are not computed, at the end (right padding) or the
    start (left padding, as batched generation pads prompts): NaN in them and their
    values never reaches the output (eager's op weighs them by 0, which gives NaN), and
    the kept keys give eager's result on clean values. The mask as a boolean key padding
    mask (query stride 0), or materialized per query row and head with -inf or, as
    Hugging Face's models build it, float32's minimum; a sequence padded whole attends to
    nothing with -inf and to every key alike with the minimum (that block is not
    trimmed)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    simaccel.clear_reports()
    q = torch.randn(3, 2, 20, 16)
    k, v = (torch.randn(3, 2, 30, 16) for _ in range(2))
    padded = slice(10, None) if side == "right" else slice(None, 20)  # two thirds
    keep = torch.ones(3, 1, 1, 30, dtype=torch.bool)
    keep[0, ..., padded] = False
    keep[1, ..., 3:5] = False  # padding inside a sequence: computed, weighed by 0
    keep[2] = False  # padded whole
    if form != "bool key padding":
        fill = float("-inf") if form == "-inf per query" else torch.finfo(torch.float32).min
        keep = torch.zeros(3, 2, 20, 30).masked_fill(~keep, fill)
    dirty_k, dirty_v = k.clone(), v.clone()
    dirty_k[0, :, padded] = dirty_v[0, :, padded] = float("nan")
    got = torch.compile(_masked_sdpa, backend="simaccel")(q, dirty_k, dirty_v, keep)
    torch.testing.assert_close(got, _masked_sdpa(q, k, v, keep), **TOL[torch.float32])
    assert torch.isnan(_masked_sdpa(q, dirty_k, dirty_v, keep)).any()  # eager computes them
    assert [k.kind for r in simaccel.reports() for k in r.kernels][-1] == "extern"
    assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 0


def test_a_left_padded_causal_mask_trims_the_blocks_whose_rows_all_keep_a_key():
    """Hugging Face's batched generation: a causal mask with the prompt padded on the
    left, float32's minimum where masked, materialized (batch, 1, L, S). A block holding
    a padded query row (which sees only padded keys: uniform attention, as eager) is not
    trimmed; the next block skips the padded keys (NaN there never reaches its rows)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    length, pad = 64, 8  # two blocks of 32 query rows (query_block, 2 batch x 1 head)
    assert templates_attention.query_block(length, causal=False, batch_heads=2) == 32
    q, k, v = (torch.randn(2, 1, length, 16) for _ in range(3))
    keep = torch.ones(length, length).tril().bool().expand(2, 1, length, length).clone()
    keep[0, ..., :pad] = False
    mask = torch.zeros(2, 1, length, length).masked_fill(~keep, torch.finfo(torch.float32).min)
    dirty_k, dirty_v = k.clone(), v.clone()
    dirty_k[0, :, :pad] = dirty_v[0, :, :pad] = float("nan")
    fn = torch.compile(_masked_sdpa, backend="simaccel")
    torch.testing.assert_close(fn(q, k, v, mask), _masked_sdpa(q, k, v, mask),
                               **TOL[torch.float32])
    got = fn(q, dirty_k, dirty_v, mask)
    assert not torch.isnan(got[0, :, 32:]).any() and not torch.isnan(got[1]).any()
    torch.testing.assert_close(got[0, :, 32:], _masked_sdpa(q, k, v, mask)[0, :, 32:],
                               **TOL[torch.float32])
    assert torch.isnan(_masked_sdpa(q, dirty_k, dirty_v, mask)[0, :, 32:]).all()
    assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 0


def test_a_padding_mask_with_dynamic_sizes_runs_in_one_graph():
    """dynamic=True: a (batch, 1, 1, keys) padding mask's sizes are the operands' size
    symbols; one graph and one attention kernel serve every (batch, length)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    simaccel.clear_reports()
    fn = torch.compile(_masked_sdpa, backend="simaccel", dynamic=True)
    for batch, length in ((2, 24), (3, 41)):
        q, k, v = (torch.randn(batch, 4, length, 16) for _ in range(3))
        mask = _masks(batch, 4, length, length)["padding"]
        torch.testing.assert_close(fn(q, k, v, mask), _masked_sdpa(q, k, v, mask),
                                   **TOL[torch.float32])
    assert [k.kind for r in simaccel.reports() for k in r.kernels] == ["pointwise", "extern"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True)])
def test_blas_gemm_intrinsic_equals_numpy(dtype, trans_a, trans_b):
    from simaccel.codegen.blas_lib import AS_STORED, TRANSPOSED, gemm

    @numba.njit
    def product(a, b, c, ta, tb, m, n, k, lda, ldb):
        gemm(ta, tb, m, n, k, a.dtype.type(1.0), a.ctypes.data, lda, b.ctypes.data, ldb,
             c.ctypes.data, m)
    rng = np.random.default_rng(0)
    m, n, k = 5, 3, 4
    # column-major operands: a (m x k) or its transpose stored, as BLAS reads them
    a = rng.standard_normal((k, m) if not trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if not trans_b else (k, n)).astype(dtype)
    c = np.zeros((n, m), dtype)  # column-major m x n
    flag = {False: AS_STORED, True: TRANSPOSED}
    product(a, b, c, flag[trans_a], flag[trans_b], m, n, k, m if not trans_a else k,
            k if not trans_b else n)
    op_a = a.T if not trans_a else a  # (m x k) as a matrix
    op_b = b.T if not trans_b else b
    np.testing.assert_allclose(c.T, op_a @ op_b, rtol=1e-5)


def _blas_threads() -> int:
    """The calling thread's MKL thread count."""
    from simaccel.codegen.blas_symbols import _torch_library
    function = _torch_library().MKL_Get_Max_Threads
    function.restype = ctypes.c_int
    return function()


def test_each_task_runs_the_blas_single_threaded_and_restores_the_count():
    """The intrinsic sets the thread's count and returns the one it had; after a call of
    the kernel (whose tasks run on the caller's thread too) the caller's MKL runs with
    as many threads as before, so eager matmuls after it keep theirs."""
    from simaccel.codegen.blas_lib import blas_threads_local

    @numba.njit
    def set_and_restore(count):
        before = blas_threads_local(count)
        inside = blas_threads_local(before)
        return before, inside
    assert set_and_restore(1) == (0, 1)
    before = _blas_threads()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 16) for _ in range(3))
    result = check(_sdpa(True), q, k, v, **TOL[torch.float32])
    assert "blas_threads_local(1)" in pathlib.Path(result.reports[-1].kernels[0].path).read_text()
    assert _blas_threads() == before


def test_a_cached_attention_kernel_links_in_a_new_process(tmp_path):
    """The kernel's machine code calls the BLAS through a symbol registered at import
    (its address differs per process): a second process loads it from the disk cache and
    computes the same output."""
    script = textwrap.dedent("""
        import torch, torch.nn.functional as F, simaccel
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 2, 40, 16) for _ in range(3))
        fn = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True), backend="simaccel")
        torch.testing.assert_close(fn(q, k, v), F.scaled_dot_product_attention(
            q, k, v, is_causal=True), rtol=1e-5, atol=1e-6)
        stats = simaccel.get_device().runtime_stats()
        print(stats["kernels_compiled"], stats["kernel_cache_hits"])
    """)
    env = {**os.environ, "SIMACCEL_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    compiled, hits = (int(n) for n in runs[1].stdout.split())
    assert compiled == 0 and hits >= 1


@pytest.mark.parametrize("causal, masked, kv_heads", [
    (True, False, 3), (False, False, 3), (False, True, 3), (True, False, 1)])
def test_the_tier0_form_equals_eager(causal, masked, kv_heads):
    """The template's numpy form (what a cold first call runs while numba compiles the
    kernel) computes what eager computes, on strided operands too, with a mask that
    masks a row whole, and with one key/value head for three query heads."""
    torch.manual_seed(0)
    q = torch.randn(2, 40, 3, 16).transpose(1, 2)  # (batch, heads, length, dim), strided
    keys = 24 if not causal else 40
    k, v = (torch.randn(2, kv_heads, keys, 16) for _ in range(2))
    mask = _masks(2, 3, 40, keys)["bool, a row masked whole"] if masked else None
    torch._dynamo.reset()
    device = simaccel.get_device()
    device.reset_stats()
    sdpa = functools.partial(F.scaled_dot_product_attention, is_causal=causal, attn_mask=mask,
                             enable_gqa=kv_heads != 3)
    fn = torch.compile(sdpa, backend="simaccel", options={"tier0": "only"})
    torch.testing.assert_close(fn(q, k, v), sdpa(q, k, v), **TOL[torch.float32])
    stats = device.runtime_stats()
    assert stats["tier0_launches"] == 1 + masked and stats["kernels_compiled"] == 0


def test_dynamic_lengths_run_the_fused_kernel_in_one_graph():
    """dynamic=True: the lengths and batch are kernel parameters, so one graph and one
    kernel serve every size (a causal prompt, then a longer one, then another batch)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    simaccel.clear_reports()
    fn = torch.compile(_sdpa(True), backend="simaccel", dynamic=True)
    for batch, length in ((2, 24), (2, 70), (3, 41)):
        q, k, v = (torch.randn(batch, 4, length, 32) for _ in range(3))
        torch.testing.assert_close(fn(q, k, v), _sdpa(True)(q, k, v), **TOL[torch.float32])
    assert [k.kind for r in simaccel.reports() for k in r.kernels] == ["extern"]


def test_a_growing_kv_cache_decodes_with_the_fused_kernel():
    """Generation: one new query against a key/value cache one longer each step (Dynamo
    makes the cache length dynamic at the second step); every step equals eager and the
    steps after the first share one graph."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    simaccel.clear_reports()
    fn = torch.compile(_sdpa(False), backend="simaccel")
    k_cache, v_cache = (torch.randn(1, 4, 8, 16) for _ in range(2))
    for _ in range(5):
        q = torch.randn(1, 4, 1, 16)
        k_cache = torch.cat([k_cache, torch.randn(1, 4, 1, 16)], dim=2)
        v_cache = torch.cat([v_cache, torch.randn(1, 4, 1, 16)], dim=2)
        torch.testing.assert_close(fn(q, k_cache, v_cache), _sdpa(False)(q, k_cache, v_cache),
                                   **TOL[torch.float32])
    kinds = [[k.kind for k in r.kernels] for r in simaccel.reports()]
    assert kinds == [["extern"], ["extern"]]  # static first step, then one dynamic graph

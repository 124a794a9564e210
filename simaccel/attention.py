"""Scaled dot-product attention as core ATen ops, forward and backward.

On CPU, ``F.scaled_dot_product_attention`` dispatches to
``aten._scaled_dot_product_flash_attention_for_cpu``, whose derivative is
``aten._scaled_dot_product_flash_attention_for_cpu_backward``; autograd saves the forward's
``logsumexp`` (shape ``(batch, heads, query)``) for it. torch 2.13's own decomposition of
the forward returns the attention weights in its place (shape ``(batch, heads, query,
key)``), so a backward fed by it computes wrong gradients. These two decompositions keep
the op's contract: the forward returns the real logsumexp, and the backward recomputes the
attention weights from it (the flash-attention recurrence, here as plain matmuls,
softmax-style reductions and pointwise ops the device fuses).

Which forward runs: floating-point attention (static or dynamic sizes) without dropout,
with or without a mask (SDPA makes a boolean mask additive before the op), grouped-query
attention too (``enable_gqa``: the op takes fewer key and value heads; the
decompositions below repeat them), keeps the op, which the device runs as its fused
attention kernel (:mod:`simaccel.codegen.templates_attention`: BLAS GEMMs per block of
query rows, the mask added and the softmax in cache; 0.77-0.96x eager's op on the
bench's 4x8x128x64 causal case, where the GEMM pair below took 1.2-1.4x). bfloat16 and
float16 run it in float32, the output rounded once and the logsumexp float32, as eager's
op keeps it; the backward below then computes in float32 too. A torch whose library
exports no BLAS GEMM takes the decomposition below, or, static with long key rows, one
library call of eager's own op.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from simaccel.codegen.templates_attention import fused_attention_takes

aten = torch.ops.aten


def _scores(q: torch.Tensor, k: torch.Tensor, is_causal: bool, attn_mask: Any,
            scale: float | None) -> torch.Tensor:
    """``q @ k^T * scale`` with the causal or additive/boolean mask applied."""
    factor = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * factor
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    return scores


#: dtypes of the fused-attention library kernels (the CPU flash attention's)
LIBRARY_DTYPES = (torch.float32, torch.float64, torch.bfloat16)


#: the longest key sequence whose attention runs as the GEMM pair rather than the fused
#: library call, and the largest score matrix (bytes) it may write. Measured on the
#: 2-core machine, causal, head dim 64, one process, alternating rounds
#: (``simaccel bench --scenarios kernel/causal`` and the same shapes longer), time over
#: eager's fused op: keys 128: GEMM pair 0.83-1.01x, library 1.19-1.32x; keys 256: GEMM
#: pair 1.31x, library 1.20x; keys 1024: 1.74x and 1.08x. The fused op's blocking pays
#: off once rows are long (it skips masked blocks and never writes the scores); short
#: rows are two library GEMMs and one row kernel.
GEMM_PAIR_MAX_KEYS = 128
GEMM_PAIR_MAX_SCORE_BYTES = 32 << 20


def _library_runs(query: torch.Tensor, key: torch.Tensor, *others: Any) -> bool:
    """True if the fused-attention library call takes these operands (static shapes, no
    size symbol, and a dtype its kernels have) and beats the GEMM pair on them (by the
    query's and key's sizes: the score matrix)."""
    present = [t for t in (query, key, *others) if t is not None]
    if not all(not any(isinstance(d, torch.SymInt) for d in t.shape)
               and t.dtype in LIBRARY_DTYPES for t in present):
        return False
    scores = math.prod(query.shape[:-1]) * key.shape[-2] * query.element_size()
    return key.shape[-2] > GEMM_PAIR_MAX_KEYS or scores > GEMM_PAIR_MAX_SCORE_BYTES


def _fused_runs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_mask: Any) -> bool:
    """True if the device's fused attention kernel takes these operands
    (:mod:`simaccel.codegen.templates_attention`): the op then stays in the graph."""
    operands = [t for t in (query, key, value, attn_mask) if t is not None]
    return fused_attention_takes([tuple(t.shape) for t in operands],
                                 [str(t.dtype).removeprefix("torch.") for t in operands],
                                 0.0)


def sdpa_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 dropout_p: float = 0.0, is_causal: bool = False, *, attn_mask: Any = None,
                 scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, logsumexp) of ``_scaled_dot_product_flash_attention_for_cpu`` (no
    dropout: with ``dropout_p > 0`` the op is left to run as it is) as a GEMM pair. The
    softmax is written ``exp(s - max) / sum``, so its row kernel computes each exp once
    (:mod:`simaccel.codegen.row_reuse`); the logsumexp is ``max + log(sum)``."""
    if dropout_p or _fused_runs(query, key, value, attn_mask) \
            or _library_runs(query, key, value, attn_mask):
        return NotImplemented
    key, value = (_repeat_heads(t, query.shape[-3]) for t in (key, value))
    if is_causal and attn_mask is None and _splits(query, key):
        return _causal_halves(query, key, value, scale)
    scores = _scores(query, key, is_causal, attn_mask, scale)
    top = scores.amax(dim=-1, keepdim=True)
    top = torch.where(top.abs() == math.inf, 0.0, top)  # a fully masked row: exp(-inf) = 0
    exps = torch.exp(scores - top)
    total = exps.sum(dim=-1, keepdim=True)
    # a fully masked row (a padded sequence) attends to nothing: output 0 and logsumexp
    # 0, as the fused op returns, rather than 0 / 0
    total = torch.where(total == 0, 1.0, total)
    return (exps / total) @ value, (torch.log(total) + top).squeeze(-1)


#: the shortest causal self-attention (query and key length) computed in two halves of
#: keys, and the dtypes it is computed in (bfloat16 keeps the single GEMM pair: the extra
#: half-sum would round once more than eager's float32-accumulated op)
SPLIT_MIN_KEYS = 128
SPLIT_DTYPES = (torch.float32, torch.float64)


def _splits(query: torch.Tensor, key: torch.Tensor) -> bool:
    """True if causal attention on these operands runs as :func:`_causal_halves`:
    static, equal and even query and key lengths of at least :data:`SPLIT_MIN_KEYS`."""
    length = query.shape[-2]
    return (isinstance(length, int) and isinstance(key.shape[-2], int)
            and length == key.shape[-2] and length % 2 == 0 and length >= SPLIT_MIN_KEYS
            and query.dtype in SPLIT_DTYPES)


def _causal_halves(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, logsumexp) of causal self-attention without the masked quarter of the
    products, as a flash kernel skips masked blocks. With ``h`` half the length, every
    query attends to the first ``h`` keys (block a, masked above the diagonal for the
    first ``h`` queries) and only the last ``h`` queries to the last ``h`` keys (block b,
    a causal ``h x h`` block): four GEMMs of 3/4 of the pair's work, each writing a dense
    result. Each block is a softmax of its own (one row kernel: its maximum, its exps and
    their sum), and the last ``h`` rows combine the two as the flash recurrence does,
    rescaling each block by ``exp(its max - the row's max)`` after the products.
    Measured for 4x8x128x64 float32, the GEMMs alone: 590 us against 780 us for the pair
    (``torch.bmm`` with ``out=``, timeit min of 7). No row is fully masked: each keeps
    its diagonal key."""
    factor = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    length = query.shape[-2]
    h = length // 2
    first_keys = torch.ones(length, h, dtype=torch.bool).tril()
    block = torch.ones(h, h, dtype=torch.bool).tril()
    top_a, total_a, out_a = _block_softmax(
        query @ key[..., :h, :].transpose(-2, -1), factor, first_keys, value[..., :h, :])
    top_b, total_b, out_b = _block_softmax(
        query[..., h:, :] @ key[..., h:, :].transpose(-2, -1), factor, block,
        value[..., h:, :])
    # the first h rows: block a alone (block b's padding: max -inf, so its weight 0)
    top_b, total_b, out_b = (_below(top_b, h, float("-inf")), _below(total_b, h),
                             _below(out_b, h))
    top = torch.maximum(top_a, top_b)
    weight_a, weight_b = torch.exp(top_a - top), torch.exp(top_b - top)
    total = total_a * weight_a + total_b * weight_b
    out = (out_a * weight_a + out_b * weight_b) / total
    return out, (torch.log(total) + top).squeeze(-1)


def _block_softmax(products: torch.Tensor, factor: float, keep: torch.Tensor,
                   value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row max, row sum of exps, unnormalised output) of one block of scores:
    ``products * factor`` masked where ``keep`` is False."""
    scores = (products * factor).masked_fill(keep.logical_not(), float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)
    exps = torch.exp(scores - top)
    return top, exps.sum(dim=-1, keepdim=True), exps @ value


def _below(rows: torch.Tensor, h: int, fill: float = 0.0) -> torch.Tensor:
    """``rows`` (the last ``h`` rows of a result) placed below ``h`` rows of ``fill``."""
    return torch.nn.functional.pad(rows, (0, 0, h, 0), value=fill)


def sdpa_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                  value: torch.Tensor, out: torch.Tensor, logsumexp: torch.Tensor,
                  dropout_p: float, is_causal: bool, *, attn_mask: Any = None,
                  scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_query, grad_key, grad_value) of the forward above, or of the fused kernel's
    (16-bit operands with its float32 logsumexp: computed in float32, as eager's op
    accumulates, each gradient rounded once)."""
    if dropout_p or _library_runs(query, key, grad_out, value, out, logsumexp,
                                   attn_mask):
        return NotImplemented
    dtype = query.dtype
    if logsumexp.dtype != dtype:
        grad_out, query, key, value, out = (t.to(logsumexp.dtype) for t in
                                            (grad_out, query, key, value, out))
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            attn_mask = attn_mask.to(logsumexp.dtype)
    kv_heads = key.shape[-3]
    key, value = (_repeat_heads(t, query.shape[-3]) for t in (key, value))
    grad_query, grad_key, grad_value = _backward(grad_out, query, key, value, out,
                                                 logsumexp, is_causal, attn_mask, scale)
    grads = (grad_query, _sum_groups(grad_key, kv_heads), _sum_groups(grad_value, kv_heads))
    return tuple(g.to(dtype) for g in grads)  # type: ignore[return-value]


def _repeat_heads(t: torch.Tensor, heads: Any) -> torch.Tensor:
    """Grouped-query attention's keys or values (``enable_gqa``: fewer heads than the
    query's, each serving a group of consecutive query heads) repeated to ``heads``."""
    if t.dim() < 3 or t.shape[-3] == heads:
        return t
    return t.repeat_interleave(heads // t.shape[-3], dim=-3)


def _sum_groups(grad: torch.Tensor, kv_heads: Any) -> torch.Tensor:
    """The gradient of :func:`_repeat_heads`: each group's heads summed into its one."""
    if grad.dim() < 3 or grad.shape[-3] == kv_heads:
        return grad
    *batch, heads, rows, dim = grad.shape
    return grad.view(*batch, kv_heads, heads // kv_heads, rows, dim).sum(-3)


def _backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, out: torch.Tensor, logsumexp: torch.Tensor,
              is_causal: bool, attn_mask: Any, scale: float | None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`sdpa_backward` on operands of one dtype: the flash recurrence's backward,
    the attention weights recomputed from the logsumexp."""
    factor = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    scores = _scores(query, key, is_causal, attn_mask, scale)
    weights = torch.exp(scores - logsumexp.unsqueeze(-1))
    grad_value = weights.transpose(-2, -1) @ grad_out
    grad_weights = grad_out @ value.transpose(-2, -1)
    row = (grad_out * out).sum(dim=-1, keepdim=True)
    grad_scores = weights * (grad_weights - row) * factor
    return grad_scores @ key, grad_scores.transpose(-2, -1) @ query, grad_value


#: op -> decomposition, added to the backend's table
ATTENTION_DECOMPOSITIONS = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: sdpa_forward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: sdpa_backward,
}

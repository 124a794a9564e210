"""Attention written out by hand, as model code from before SDPA spells it: the variants
:mod:`simaccel.attention_rewrite` makes one SDPA call, and near misses it must leave as
written. Inputs are (batch, heads, tokens, head dim) q, k and v."""
from __future__ import annotations

import math

import torch
from torch import nn


class SelectMaskAttention(nn.Module):
    """Hugging Face GPT-2's eager attention: scores divided by sqrt(head dim), times a
    config factor, a causal select with the dtype's minimum, softmax, weights @ v."""

    def __init__(self, positions: int = 64, factor: float = 1.0) -> None:
        super().__init__()
        self.factor = factor
        causal = torch.tril(torch.ones(positions, positions, dtype=torch.bool))
        self.register_buffer("bias", causal.view(1, 1, positions, positions),
                             persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t = q.shape[-2]
        w = q @ k.transpose(-1, -2)
        w = w / math.sqrt(v.shape[-1])
        w = w * self.factor
        w = torch.where(self.bias[:, :, :t, :t], w, torch.finfo(w.dtype).min)
        return w.softmax(dim=-1) @ v


class AdditiveMaskAttention(nn.Module):
    """Llama's eager attention: ``q @ k^T * scaling + mask`` (the mask first here, as
    some models add it), ``torch.softmax``, ``torch.matmul``."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(2, 3)) * (q.shape[-1] ** -0.5)
        return torch.matmul(torch.softmax(mask + scores, dim=-1), v)


class PaddedAttention(nn.Module):
    """A padding mask as ``masked_fill`` of the positions to hide (True: hidden) with a
    large finite value, then a causal additive mask: two masks in one chain."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                hidden: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        scores = (q @ k.transpose(-2, -1)) / 8.0
        scores = scores.masked_fill(hidden, -1e30) + causal
        return scores.softmax(-1) @ v


class InfFillAttention(nn.Module):
    """nanoGPT's slow path: ``masked_fill`` with -inf (a row hidden whole is NaN)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                hidden: torch.Tensor) -> torch.Tensor:
        scores = (q @ k.transpose(-1, -2)).masked_fill(hidden, float("-inf"))
        return scores.softmax(dim=-1) @ v


class WeightsReturnedAttention(nn.Module):
    """The weights are returned too (``output_attentions``): left as written."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        weights = (q @ k.transpose(-1, -2) * 0.25).softmax(dim=-1)
        return weights @ v, weights


class DropoutAttention(nn.Module):
    """Dropout on the weights: rewritten in eval (the dropout is gone), left as written
    while training (its mask is drawn per weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        weights = self.drop((q @ k.transpose(-1, -2) * 0.25).softmax(dim=-1))
        return weights @ v


class HFGPT2Attention(nn.Module):
    """``transformers``' GPT2Attention eager path as written there: the divisor and the
    fill as 0-d ``torch.full`` tensors, a cast to the dtype the weights have, the causal
    window sliced for the query rows, ``.type(value.dtype)`` after the softmax."""

    def __init__(self, positions: int = 32) -> None:
        super().__init__()
        causal = torch.tril(torch.ones(positions, positions, dtype=torch.bool))
        self.register_buffer("bias", causal.view(1, 1, positions, positions),
                             persistent=False)
        self.attn_dropout = nn.Dropout(0.1)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
                ) -> torch.Tensor:
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        attn_weights = attn_weights / torch.full(
            [], value.size(-1) ** 0.5, dtype=attn_weights.dtype, device=attn_weights.device)
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length:key_length, :key_length]
        mask_value = torch.full([], torch.finfo(attn_weights.dtype).min,
                                dtype=attn_weights.dtype, device=attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype),
                                   mask_value)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = self.attn_dropout(attn_weights.type(value.dtype))
        return torch.matmul(attn_weights, value)


class LlamaEagerAttention(nn.Module):
    """``transformers``' Llama ``eager_attention_forward``: the softmax in float32, cast
    back to the query's dtype, then an (inactive) dropout."""

    def __init__(self, scaling: float) -> None:
        super().__init__()
        self.scaling = scaling

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                causal_mask: torch.Tensor) -> torch.Tensor:
        attn_weights = torch.matmul(query, key.transpose(2, 3)) * self.scaling
        attn_weights = attn_weights + causal_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1,
                                             dtype=torch.float32).to(query.dtype)
        attn_weights = nn.functional.dropout(attn_weights, p=0.0, training=self.training)
        return torch.matmul(attn_weights, value)

"""Small models written in plain torch, shared by the end-to-end tests."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp(d_in: int = 16, hidden: int = 32, d_out: int = 4) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, d_out))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, groups=2, stride=1, padding=1, dilation=1), nn.ReLU(),
        nn.AvgPool2d(2), nn.Conv2d(8, 8, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(8, 4))


class TransformerBlock(nn.Module):
    """Embedding, layer norm, causal attention, GELU-tanh MLP, residuals."""

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, dim)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ff1, self.ff2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x)), approximate="tanh"))

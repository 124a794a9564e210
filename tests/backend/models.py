"""Small models written in plain torch, shared by the end-to-end tests."""
from __future__ import annotations

import torch
import torch.nn as nn

from simaccel.demo import TinyBlock


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
    """Embedding, then the demo's block: layer norm, causal attention, GELU-tanh MLP,
    residuals."""

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.block = TinyBlock(dim, heads)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.block(self.emb(tokens))

"""A decoder layer with a KV cache, as generation loops write it: the cache grows by one
row per step (``torch.cat``), or is preallocated and written in place (slice assignment,
``index_copy_``) with the attended length passed as an int."""
from __future__ import annotations

import math

import torch
import torch.nn as nn


class CachedAttention(nn.Module):
    """Single-layer causal self-attention over a cache of past keys and values."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Softmax attention of ``q`` over ``k`` and ``v`` (keys where ``hidden`` is True
        left out)."""
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        if hidden is not None:
            scores = scores.masked_fill(hidden, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        b, h, t, d = out.shape
        return self.out(out.transpose(1, 2).reshape(b, t, h * d))

    def grow(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step on a cache that grows by ``torch.cat``: (output, keys, values)."""
        q, k, v = (self._split(t) for t in self.qkv(x).chunk(3, dim=-1))
        k_all = torch.cat([k_cache, k], dim=2)
        v_all = torch.cat([v_cache, v], dim=2)
        return self.attend(q, k_all, v_all), k_all, v_all

    def write(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              pos: int) -> torch.Tensor:
        """One step on a preallocated cache: row ``pos`` written in place, rows
        ``[0, pos]`` attended."""
        q, k, v = (self._split(t) for t in self.qkv(x).chunk(3, dim=-1))
        k_cache[:, :, pos:pos + 1] = k
        v_cache.index_copy_(2, torch.tensor([pos]), v)
        return self.attend(q, k_cache[:, :, :pos + 1], v_cache[:, :, :pos + 1])


class StaticCacheAttention(CachedAttention):
    """:class:`CachedAttention` over a static cache, as decode loops on static-shape
    hardware keep one (Hugging Face's ``StaticCache``): buffers preallocated for
    ``length`` positions, the step's keys and values written in place at ``position`` (a
    tensor), the positions not yet written masked out: every step has the same sizes."""

    def __init__(self, length: int, dim: int = 32, heads: int = 4):
        super().__init__(dim, heads)
        for name in ("k_cache", "v_cache"):
            self.register_buffer(name, torch.zeros(1, heads, length, dim // heads))

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        q, k, v = (self._split(t) for t in self.qkv(x).chunk(3, dim=-1))
        self.k_cache.index_copy_(2, position, k)
        self.v_cache.index_copy_(2, position, v)
        unwritten = torch.arange(self.k_cache.shape[2]) > position
        return self.attend(q, self.k_cache, self.v_cache, unwritten)

"""A Llama-style decoder block, as such models write it: a config object, RMSNorm, rotary
position embeddings, grouped-query attention through ``F.scaled_dot_product_attention``
(``enable_gqa``: fewer key and value heads than query heads), a SwiGLU MLP, and a
generation step that appends to a key/value cache kept with the fewer heads."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    hidden_size: int = 64
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """``x`` (batch, heads, length, head_dim) rotated by its positions (length,)."""
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    return x * emb.cos() + rotate_half(x) * emb.sin()


class LlamaBlock(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = c = config
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        kv = c.num_key_value_heads * c.head_dim
        self.k_proj = nn.Linear(c.hidden_size, kv, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, kv, bias=False)
        self.o_proj = nn.Linear(c.hidden_size, c.hidden_size, bias=False)
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.input_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, self.config.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """(output, (keys, values)): ``x`` (batch, length, hidden) after ``past``'s
        cached keys and values (batch, kv heads, cached length, head_dim), if any."""
        c = self.config
        start = 0 if past is None else past[0].shape[2]
        positions = torch.arange(start, start + x.shape[1])
        h = self.input_norm(x)
        q = rotary(self._heads(self.q_proj(h), c.num_attention_heads), positions, c.rope_theta)
        k = rotary(self._heads(self.k_proj(h), c.num_key_value_heads), positions, c.rope_theta)
        v = self._heads(self.v_proj(h), c.num_key_value_heads)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=past is None, enable_gqa=True)
        x = x + self.o_proj(out.transpose(1, 2).reshape(x.shape))
        h = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)), (k, v)

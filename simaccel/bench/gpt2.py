"""A GPT-2-style decoder, written the way Hugging Face-style model code is: a config
object holding every size, flag and hyperparameter, a ``ModuleList`` of blocks sliced by
``config.n_layer``, a causal mask buffer, a tanh-GELU MLP and a tied output projection.

Issue 15's compile-latency figures are measured on it (``--workload gpt2`` of
:mod:`simaccel.bench.coldstart`, the ``compile/*_gpt2_*`` bench scenarios); width 128,
4 heads, 64 positions by default.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class GPT2Config:
    """The model's settings. Most steer tracing only (sizes, flags, ``eps``, dropout
    probabilities); ``attn_scale_factor`` multiplies the attention scores as an operand."""

    def __init__(self, n_layer: int = 6, n_embd: int = 128, n_head: int = 4,
                 n_positions: int = 64, vocab_size: int = 512) -> None:
        self.n_layer = n_layer
        self.n_embd = n_embd
        self.n_head = n_head
        self.n_positions = n_positions
        self.vocab_size = vocab_size
        self.n_inner = 4 * n_embd
        self.layer_norm_epsilon = 1e-5
        self.resid_pdrop = 0.1
        self.embd_pdrop = 0.1
        self.attn_pdrop = 0.1
        self.initializer_range = 0.02
        self.scale_attn_weights = True
        self.attn_scale_factor = 1.0
        self.tie_word_embeddings = True
        self.use_cache = False
        self.output_attentions = False


class CausalSelfAttention(nn.Module):
    """Fused qkv projection, masked softmax attention with a registered causal mask."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.config = cfg
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        mask = torch.tril(torch.ones(cfg.n_positions, cfg.n_positions, dtype=torch.bool))
        self.register_buffer("bias", mask.view(1, 1, cfg.n_positions, cfg.n_positions),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        b, t, c = x.shape
        head_dim = c // cfg.n_head
        q, k, v = (z.view(b, t, cfg.n_head, head_dim).transpose(1, 2)
                   for z in self.c_attn(x).split(cfg.n_embd, dim=2))
        w = q @ k.transpose(-1, -2)
        if cfg.scale_attn_weights:
            w = w / math.sqrt(head_dim)
        w = w * cfg.attn_scale_factor
        w = torch.where(self.bias[:, :, :t, :t], w, torch.finfo(w.dtype).min)
        w = F.dropout(w.softmax(dim=-1), p=cfg.attn_pdrop, training=self.training)
        y = (w @ v).transpose(1, 2).reshape(b, t, c)
        return F.dropout(self.c_proj(y), p=cfg.resid_pdrop, training=self.training)


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.config = cfg
        self.c_fc = nn.Linear(cfg.n_embd, cfg.n_inner)
        self.c_proj = nn.Linear(cfg.n_inner, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.c_fc(x), approximate="tanh")
        return F.dropout(self.c_proj(h), p=self.config.resid_pdrop, training=self.training)


class Block(nn.Module):
    """Pre-norm residual block."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """Token + position embeddings, ``config.n_layer`` blocks, final norm, tied head."""

    def __init__(self, cfg: GPT2Config | None = None) -> None:
        super().__init__()
        self.config = cfg = cfg or GPT2Config()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        if cfg.use_cache or cfg.output_attentions:
            raise NotImplementedError("this model returns logits only")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = F.dropout(self.wte(tokens) + self.wpe(positions), p=cfg.embd_pdrop,
                      training=self.training)
        for block in self.h[: cfg.n_layer]:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt2(n_layer: int = 6, batch: int = 2, seq: int = 64) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model in eval mode (seeded) and its input: ``batch`` sequences of ``seq`` ids."""
    torch.manual_seed(0)
    model = GPT2(GPT2Config(n_layer=n_layer)).eval()
    return model, (torch.randint(0, model.config.vocab_size, (batch, seq)),)

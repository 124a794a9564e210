"""Models that read their settings from a config object, as Hugging Face-style models do.

* :class:`Decoder` slices its ``nn.ModuleList`` by a config int
  (``self.layers[: config.num_hidden_layers]``) and branches on a float attribute
  (``if config.residual_scale != 1.0``).
* :class:`ConfigModel` holds a config object with 20 float/int/bool settings, read in
  ``forward`` as shapes, loop bounds, ``double`` hyperparameters, flags and comparisons;
  only two of them (``attn_scale``, ``logit_scale``) feed the graph as operands.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DecoderConfig:
    def __init__(self) -> None:
        self.num_hidden_layers = 2
        self.residual_scale = 1.0
        self.hidden_size = 16


class Decoder(nn.Module):
    def __init__(self, config: DecoderConfig, max_layers: int = 3) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(nn.Linear(config.hidden_size, config.hidden_size)
                                    for _ in range(max_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[: self.config.num_hidden_layers]:
            x = torch.tanh(layer(x))
        if self.config.residual_scale != 1.0:
            x = x * self.config.residual_scale
        return x


class ModelConfig:
    """20 settings; the graph uses ``attn_scale`` and ``logit_scale`` as operands."""

    def __init__(self) -> None:
        self.hidden_size = 32
        self.num_heads = 4
        self.num_layers = 2
        self.vocab_size = 50
        self.max_position_embeddings = 64
        self.intermediate_size = 64
        self.layer_norm_eps = 1e-5
        self.dropout_rate = 0.1
        self.attention_dropout = 0.0
        self.initializer_range = 0.02
        self.attn_scale = 0.25
        self.logit_scale = 1.5
        self.pad_token_id = 0
        self.bos_token_id = 1
        self.eos_token_id = 2
        self.use_cache = False
        self.tie_word_embeddings = True
        self.scale_attn_weights = True
        self.output_attentions = False
        self.rope_theta = 10000.0


class ConfigBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        b, t, _ = x.shape
        h = F.layer_norm(x, (cfg.hidden_size,), eps=cfg.layer_norm_eps)
        q, k, v = self.qkv(h).split(cfg.hidden_size, dim=-1)
        heads, width = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        q, k, v = (z.view(b, t, heads, width).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2)
        if cfg.scale_attn_weights:
            scores = scores * cfg.attn_scale
        attn = F.dropout(scores.softmax(-1), p=cfg.attention_dropout, training=self.training)
        y = (attn @ v).transpose(1, 2).reshape(b, t, cfg.hidden_size)
        return x + F.dropout(self.out(y), p=cfg.dropout_rate, training=self.training)


class ConfigModel(nn.Module):
    def __init__(self, config: ModelConfig | None = None) -> None:
        super().__init__()
        self.config = config or ModelConfig()
        cfg = self.config
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos = nn.Parameter(torch.randn(cfg.max_position_embeddings, cfg.hidden_size) * 0.02)
        self.blocks = nn.ModuleList(ConfigBlock(cfg) for _ in range(cfg.num_layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        if cfg.output_attentions or cfg.use_cache:
            raise NotImplementedError
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks[: cfg.num_layers]:
            x = block(x)
        x = F.layer_norm(x, (cfg.hidden_size,), eps=cfg.layer_norm_eps)
        logits = x @ self.embed.weight.t() if cfg.tie_word_embeddings else x
        if tokens[0, 0] is not None and cfg.pad_token_id >= 0:
            logits = logits * cfg.logit_scale
        return logits

"""The config-object compile workload: a small transformer-style model that reads 20
float/int/bool settings from a config object, as Hugging Face-style models do.

Most settings are shapes, loop bounds, flags, ATen hyperparameters (``eps``, dropout
``p``) or comparisons: Dynamo specializes them and simaccel keeps them specialized. Only
two (``attn_scale``, ``logit_scale``) feed the graph as operands, so with
``options={"lift": "auto"}`` the first compile lifts those two with one re-trace. The
``compile/lift_*_config_model`` scenarios time that first compile (in a new process,
empty caches: :mod:`simaccel.bench.coldstart`) against ``lift="off"``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: the settings that feed the graph as operands (the rest only steer tracing)
OPERAND_SETTINGS = ("attn_scale", "logit_scale")


class BenchModelConfig:
    """20 settings; the graph uses ``attn_scale`` and ``logit_scale`` as operands."""

    def __init__(self) -> None:
        self.hidden_size = 32
        self.num_heads = 4
        self.num_layers = 1
        self.vocab_size = 64
        self.max_position_embeddings = 32
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
    """Pre-norm attention, every size and flag read from the config."""

    def __init__(self, cfg: BenchModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        b, t, _ = x.shape
        h = F.layer_norm(x, (cfg.hidden_size,), eps=cfg.layer_norm_eps)
        heads, width = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        q, k, v = (z.view(b, t, heads, width).transpose(1, 2)
                   for z in self.qkv(h).split(cfg.hidden_size, dim=-1))
        scores = q @ k.transpose(-1, -2)
        if cfg.scale_attn_weights:
            scores = scores * cfg.attn_scale
        attn = F.dropout(scores.softmax(-1), p=cfg.attention_dropout, training=self.training)
        y = (attn @ v).transpose(1, 2).reshape(b, t, cfg.hidden_size)
        return x + F.dropout(self.out(y), p=cfg.dropout_rate, training=self.training)


class ConfigModel(nn.Module):
    """Embedding, ``num_layers`` blocks, tied output projection scaled by ``logit_scale``."""

    def __init__(self, cfg: BenchModelConfig | None = None) -> None:
        super().__init__()
        self.config = cfg = cfg or BenchModelConfig()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos = nn.Parameter(torch.randn(cfg.max_position_embeddings, cfg.hidden_size)
                                * cfg.initializer_range)
        self.blocks = nn.ModuleList(ConfigBlock(cfg) for _ in range(cfg.num_layers))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        if cfg.output_attentions or cfg.use_cache:
            raise NotImplementedError("the bench model returns logits only")
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks[: cfg.num_layers]:
            x = block(x)
        x = F.layer_norm(x, (cfg.hidden_size,), eps=cfg.layer_norm_eps)
        logits = x @ self.embed.weight.t() if cfg.tie_word_embeddings else x
        if cfg.pad_token_id >= 0:
            logits = logits * cfg.logit_scale
        return logits


def config_model() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model in eval mode and its input: 2 sequences of 16 token ids."""
    torch.manual_seed(0)
    model = ConfigModel().eval()
    return model, (torch.randint(0, model.config.vocab_size, (2, 16)),)

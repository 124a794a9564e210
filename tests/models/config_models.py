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
from torch import nn

from simaccel.bench.configmodel import BenchModelConfig
from simaccel.bench.configmodel import ConfigModel as BenchConfigModel


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


class ModelConfig(BenchModelConfig):
    """The bench's 20-setting config (``attn_scale`` and ``logit_scale`` are the graph's
    operands), with two layers and other table sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.num_layers = 2
        self.vocab_size = 50
        self.max_position_embeddings = 64


class ConfigModel(BenchConfigModel):
    """:class:`simaccel.bench.configmodel.ConfigModel` on a :class:`ModelConfig`."""

    def __init__(self, config: ModelConfig | None = None) -> None:
        super().__init__(config or ModelConfig())

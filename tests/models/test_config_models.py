"""Models driven by a config object: never more graphs than ``lift="off"``, at most one
re-trace, no warning per setting."""
from __future__ import annotations

import logging

import pytest
import torch
from torch._dynamo.utils import counters

import simaccel
import simaccel.guards as guards
from config_models import ConfigModel, Decoder, DecoderConfig
from optim_steps import unique_graphs

TOL = {"rtol": 1e-5, "atol": 1e-5}
#: (num_hidden_layers, residual_scale) per call: a slice bound and a branch that change
DECODER_CALLS = [(2, 1.0), (2, 1.0), (3, 1.0), (1, 2.0), (1, 2.0), (2, 0.5)]


def _fresh() -> None:
    torch._dynamo.reset()
    counters.clear()


def _run_decoder(options: dict) -> int:
    _fresh()
    torch.manual_seed(0)
    model = Decoder(DecoderConfig())
    compiled = torch.compile(model, backend="simaccel", options=options)
    x = torch.randn(2, 16)
    with torch.no_grad():
        for layers, scale in DECODER_CALLS:
            model.config.num_hidden_layers, model.config.residual_scale = layers, scale
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    return unique_graphs()


def test_decoder_slicing_layers_by_a_config_int_never_beats_lift_off(caplog) -> None:
    """``self.layers[: config.num_hidden_layers]`` cannot take a SymInt (Dynamo raises
    inside its trace); ``if config.residual_scale != 1.0`` only steers a branch. Neither
    is lifted on the first compile; the slice bound, tried once it changes, fails and is
    kept specialized with one WARNING line; results equal eager on every call."""
    off = _run_decoder({"lift": "off"})
    with caplog.at_level(logging.WARNING, logger="simaccel"):
        auto = _run_decoder({"lift": "auto"})
    assert auto <= off, (auto, off)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) <= 1, [r.getMessage() for r in warnings]
    kept = {k.source: k.reason for r in simaccel.reports() for k in r.guards.kept}
    assert "L['self'].config.num_hidden_layers" in kept


def test_config_object_model_lifts_its_two_operands_on_the_first_trace(monkeypatch,
                                                                      caplog) -> None:
    traces = []
    lift_scalars = guards.lift_scalars
    monkeypatch.setattr(guards, "lift_scalars",
                        lambda *a, **k: traces.append(1) or lift_scalars(*a, **k))
    torch.manual_seed(0)
    model = ConfigModel().eval()
    tokens = torch.randint(0, 50, (2, 8))
    compiled = torch.compile(model, backend="simaccel")
    with caplog.at_level(logging.INFO, logger="simaccel"), torch.no_grad():
        torch.testing.assert_close(compiled(tokens), model(tokens), **TOL)
    assert len(traces) == 1  # both are floats: lifted on the first trace
    report = simaccel.reports()[-1].guards
    assert set(report.lifted_sources) == {"L['self'].config.attn_scale",
                                          "L['self'].config.logit_scale"}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    with torch.no_grad():
        for scale in (0.5, 0.75, 0.125):
            model.config.attn_scale, model.config.logit_scale = scale, 2 * scale
            torch.testing.assert_close(compiled(tokens), model(tokens), **TOL)
    assert unique_graphs() == 1


@pytest.mark.parametrize("dynamic", (None, False), ids=lambda d: f"dynamic={d}")
def test_float_branch_attribute_compiles_no_more_than_lift_off(dynamic) -> None:
    """``if self.scale != 1.0``: a comparison only; lifting is never worse."""
    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = 1.0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale if self.scale != 1.0 else x + 1

    graphs = {}
    for lift in ("off", "auto"):
        _fresh()
        model = Scaled()
        compiled = torch.compile(model, backend="simaccel", dynamic=dynamic,
                                 options={"lift": lift})
        for scale in (1.0, 1.0, 2.0, 3.0, 1.0, 4.0):
            model.scale = scale
            x = torch.randn(4)
            torch.testing.assert_close(compiled(x), model(x))
        graphs[lift] = unique_graphs()
    assert graphs["auto"] <= graphs["off"], graphs

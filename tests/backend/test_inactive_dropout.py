"""Inactive dropouts leave Dynamo's graph before AOTAutograd (:mod:`simaccel.pre_aot`): an
eval-mode model's ``nn.Dropout`` hands its input on, as in eager, and an active or
symbolic one stays."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import simaccel
from simaccel.pre_aot import drop_inactive_dropouts

from tests.conftest import check


def _dropout_targets(gm: torch.fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function"
            and n.target in (F.dropout, torch.dropout)]


def test_only_literally_inactive_dropouts_are_dropped():
    graph = torch.fx.Graph()
    x, p = graph.placeholder("x"), graph.placeholder("p")
    kept = [graph.call_function(F.dropout, (x,)),  # F.dropout trains by default
            graph.call_function(F.dropout, (x, 0.2, True)),
            graph.call_function(F.dropout, (x, p), {"training": True})]
    dropped = [graph.call_function(F.dropout, (x,), {"p": 0.1, "training": False}),
               graph.call_function(F.dropout, (x, 0.0)),
               graph.call_function(torch.dropout, (x, 0.5, False))]
    graph.output(tuple(kept + dropped))
    gm = torch.fx.GraphModule({}, graph)
    assert drop_inactive_dropouts(gm) == 3
    assert _dropout_targets(gm) == kept
    assert list(gm.graph.nodes)[-1].args[0][3:] == (x, x, x)


def _mlp(dropout: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    drop = (lambda p: torch.nn.Dropout(p)) if dropout else (lambda p: torch.nn.Identity())
    return torch.nn.Sequential(torch.nn.Linear(16, 32), drop(0.1), torch.nn.GELU(), drop(0.2),
                               torch.nn.Linear(32, 8)).eval()


def test_an_eval_mode_model_equals_eager_without_its_dropouts():
    x = torch.randn(4, 16)
    with torch.no_grad():
        with_dropouts = check(_mlp(True), x).reports[-1].ops
        without = check(_mlp(False), x).reports[-1].ops
    assert with_dropouts == without  # no clone left of the two dropouts


def test_an_inactive_dropout_of_an_input_returns_its_values():
    check(lambda x: F.dropout(x, 0.3, training=False) * 2, torch.randn(5, 3))


def test_a_training_dropout_still_drops():
    torch.manual_seed(0)
    x = torch.ones(2000)
    simaccel.clear_reports()
    out = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="simaccel")(x)
    zeros = (out == 0).float().mean().item()
    assert 0.4 < zeros < 0.6 and set(out.unique().tolist()) <= {0.0, 2.0}

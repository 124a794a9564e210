"""Lifting decisions kept between processes (simaccel.guards.lift_memory): a warm start
skips the re-trace that found a source must stay specialized; results never change."""
from __future__ import annotations

import logging
import textwrap

import torch

import simaccel
from conftest import unique_graphs
from simaccel.guards import lift_memory
from tests.codegen.child import run_child_program

# A module whose int attribute is a shape and an operand (the first trace cannot tell it
# stays specialized: a second re-trace finds it) and whose float attribute is lifted.
CHILD = textwrap.dedent("""
    import json, torch, simaccel
    from torch._dynamo.utils import counters

    class Heads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads, self.scale = 4, 0.5
        def forward(self, x):
            return (x.view(x.shape[0], self.heads, -1) * self.scale).sum(-1) + self.heads

    torch.manual_seed(0)
    m, x = Heads(), torch.randn(3, 16)
    compiled = torch.compile(m, backend="simaccel", dynamic=False)
    errors = []
    for scale in (0.5, 0.25, 2.0):
        m.scale = scale
        errors.append(float((compiled(x) - m(x)).abs().max()))
    report = simaccel.reports()[-1].guards
    print(json.dumps({
        "captured": counters["stats"]["calls_captured"],
        "graphs": counters["stats"]["unique_graphs"],
        "errors": errors,
        "lifted": sorted(s.source for s in report.lifted),
        "kept": {k.source: k.reason for k in report.kept},
        "launches": simaccel.get_device().runtime_stats()["kernel_launches"]}))
""")


def test_a_warm_process_skips_the_re_trace_and_equals_eager(tmp_path) -> None:
    cold = run_child_program(CHILD, tmp_path)
    warm = run_child_program(CHILD, tmp_path)
    for run in (cold, warm):
        assert max(run["errors"]) < 1e-6 and run["graphs"] == 1 and run["launches"] > 0
        assert run["lifted"] == ["L['self'].scale"]
        assert run["kept"]["L['self'].heads"].startswith("used as a tensor shape")
    # cold: trace, lifting re-trace, re-trace without heads; warm: heads skipped up front
    assert warm["captured"] < cold["captured"]
    assert len(list((tmp_path / "lift").glob("*.json"))) == 1


def test_entries_this_process_wrote_are_not_read_back(tmp_path) -> None:
    def scaled(x: torch.Tensor, n: int, a: float) -> torch.Tensor:
        return x.view(n, -1) * a * n  # n: an operand too, so a re-trace finds the shape

    x = torch.randn(4, 6)
    for _ in range(2):  # the second compile after reset() behaves as the first
        torch._dynamo.reset()
        compiled = torch.compile(scaled, backend="simaccel", dynamic=False)
        torch.testing.assert_close(compiled(x, 2, 0.5), scaled(x, 2, 0.5))
        kept = {k.source: k.reason for k in simaccel.reports()[-1].guards.kept}
        assert "earlier" not in kept["L['n']"]
    assert lift_memory.load(scaled.__code__) == {}


def test_a_malformed_entry_is_ignored_with_a_warning(caplog) -> None:
    def shifted(x: torch.Tensor, a: float) -> torch.Tensor:
        return x + a

    path = lift_memory._path(lift_memory._key(shifted.__code__))
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="simaccel"):
        compiled = torch.compile(shifted, backend="simaccel", dynamic=False)
        x = torch.randn(5)
        for a in (0.5, 1.5, -2.0):
            torch.testing.assert_close(compiled(x, a), shifted(x, a))
    assert unique_graphs() == 1  # lifted as usual
    assert any("unreadable lifting memory" in r.getMessage() for r in caplog.records)


def test_an_edited_function_has_another_entry() -> None:
    def one(x):
        return x * 2

    def two(x):
        return x * 3

    assert lift_memory._key(one.__code__) != lift_memory._key(two.__code__)

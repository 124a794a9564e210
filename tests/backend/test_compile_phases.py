"""Compile phase timers (``simaccel.compile_times()``, ``CompileReport.phases_ms``): every
phase of a graph's compile is measured, they add up to no more than the compile, and the
process table adds Dynamo's frame-level phases. The compiled function still equals eager
and ran on the device."""
from __future__ import annotations

import torch

import simaccel
from simaccel.timers import GRAPH_PHASES

from tests.conftest import POINTWISE_TOL


def test_each_graph_reports_its_phases_and_the_process_table_adds_dynamos():
    simaccel.clear_reports()
    x = torch.randn(32, 8)
    fn = lambda x: (x.sin() * 2).cos()  # noqa: E731
    torch.testing.assert_close(torch.compile(fn, backend="simaccel")(x), fn(x),
                               **POINTWISE_TOL)
    assert simaccel.get_device().runtime_stats()["kernel_launches"] == 1
    report = simaccel.reports()[-1]
    assert list(report.phases_ms) == list(GRAPH_PHASES)
    assert all(ms >= 0 for ms in report.phases_ms.values())
    assert sum(report.phases_ms.values()) <= report.compile_ms + 1.0
    assert "compile phases: decompose" in report.summary()
    table = simaccel.compile_times()
    for phase in ("dynamo trace", "aot_autograd", *GRAPH_PHASES):
        assert table[phase] >= 0, table
    assert table["kernels"] >= report.phases_ms["kernels"] / 1e3
    assert all(len(v) >= 1 for v in simaccel.compile_times(aggregate=False).values())

"""Lifted floats reach a directly called graph as Python numbers (no 0-d tensor per call).

Dynamo wraps an unspecialized float in ``torch._as_tensor_fullprec`` before every call of
the graph; simaccel clears that for the constant-bank inputs of graphs it calls directly
(:mod:`simaccel.guards.dynamo.rawargs`). Each test counts the wrapper's calls, compares
with eager as the scalars change and checks the recompile counts.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

import simaccel
from simaccel import get_device


@pytest.fixture
def as_tensor_calls(monkeypatch) -> list[Any]:
    """Every call of ``torch._as_tensor_fullprec`` (the frame's bytecode looks the name up
    on the torch module at each call)."""
    calls: list[Any] = []
    real = torch._as_tensor_fullprec

    def counted(value: Any) -> torch.Tensor:
        calls.append(value)
        return real(value)
    monkeypatch.setattr(torch, "_as_tensor_fullprec", counted)
    return calls


def _scaled(x: torch.Tensor, a: float, b: float, n: int) -> torch.Tensor:
    return x * a + b * n


def _drive(backend: str, as_tensor_calls: list[Any], dynamic: bool | None = False
           ) -> tuple[int, int]:
    """Six calls with new float values; returns (graphs, wrapper calls in the last 5)."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_scaled, backend=backend, dynamic=dynamic)
    x = torch.randn(16)
    for i in range(6):
        if i == 1:
            as_tensor_calls.clear()
        a, b = 0.5 + i / 3, -1.25 * i
        torch.testing.assert_close(compiled(x, a, b, 3), _scaled(x, a, b, 3),
                                   rtol=1e-6, atol=1e-6)
    return counters["stats"]["unique_graphs"], len(as_tensor_calls)


def test_lifted_floats_of_a_direct_graph_are_passed_unwrapped(as_tensor_calls) -> None:
    get_device().reset_stats()
    simaccel.clear_reports()
    graphs, wrapped = _drive("simaccel", as_tensor_calls)
    assert graphs == 1 and wrapped == 0
    stats = get_device().runtime_stats()
    assert stats["kernel_launches"] >= 6 and stats["host_fallback_ops"] == 0
    assert get_device().dma_stats()["const.bytes"] > 0  # the new values reached the bank
    assert "2 lifted scalar(s) passed as Python numbers" in simaccel.reports()[-1].call_path


def test_dynamo_alone_still_wraps_them(as_tensor_calls) -> None:
    """The baseline the change removes: if torch stops wrapping, this module is moot."""
    with torch._dynamo.config.patch(specialize_float=False):
        graphs, wrapped = _drive("eager", as_tensor_calls, dynamic=None)
    assert graphs <= 2 and wrapped >= 5 * 2 - 2


def test_a_graph_behind_the_runtime_wrapper_keeps_the_tensors(as_tensor_calls) -> None:
    """A training graph runs through AOTAutograd's wrapper, which expects tensors."""
    torch._dynamo.reset()
    counters.clear()
    w = torch.randn(8, requires_grad=True)

    def step(x: torch.Tensor, lr: float) -> torch.Tensor:
        return (x * w * lr).sum()
    compiled = torch.compile(step, backend="simaccel", dynamic=False)
    x = torch.randn(8)
    for i, lr in enumerate((0.1, 0.2, 0.3)):
        if i == 1:
            as_tensor_calls.clear()
        w.grad = None
        compiled(x, lr).backward()
        torch.testing.assert_close(w.grad, x * lr)
    assert len(as_tensor_calls) == 2 and counters["stats"]["unique_graphs"] == 1

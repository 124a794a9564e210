"""Direct replays end to end (simaccel.runtime.direct): a plain static-shape graph's
steady calls replay without Program.run's per-call work, outputs cloned from the device
views. Every call is compared with eager (values, shape, dtype, strides); the counters
prove the device path ran and that a direct call moves, launches and counts what the
general replay does; no recompile."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch._dynamo.utils import counters

import simaccel
import simaccel.compiled
from simaccel.runtime.direct import DirectReplay

#: fp32 pointwise ops in one fused kernel against eager's: the same ops in the same order
TOL = {"rtol": 1e-6, "atol": 1e-6}


@pytest.fixture
def direct_calls(monkeypatch) -> list[int]:
    """Counts the direct calls that replayed (one entry per call)."""
    calls: list[int] = []
    original = DirectReplay.__call__

    def counted(self: DirectReplay, *args: Any) -> Any:
        outputs = original(self, *args)
        if outputs is not None:
            calls.append(1)
        return outputs
    monkeypatch.setattr(DirectReplay, "__call__", counted)
    return calls


def affine_pair(x: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tanh(x * scale + 1.0), (x * x).sum(dim=1)


def run_steps(fn: Callable, make_x: Callable[[int], torch.Tensor], steps: int) -> dict:
    """Calls of ``fn`` compiled, each compared with eager; the device counters after."""
    torch._dynamo.reset()
    counters.clear()
    device = simaccel.get_device()
    device.reset_stats()
    compiled = torch.compile(fn, backend="simaccel", dynamic=False)
    for k in range(steps):
        x, scale = make_x(k), 0.5 + k % 2  # a lifted float changing every other call
        got, want = compiled(x, scale), fn(x, scale)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **TOL)
            assert g.stride() == w.stride() and not g.requires_grad
    return {**device.runtime_stats(), **device.dma_stats(),
            "graphs": counters["stats"]["unique_graphs"]}


@pytest.mark.parametrize("inputs", ["the same tensor, updated in place", "a new tensor"])
def test_steady_calls_replay_directly_and_count_what_general_replays_count(
        inputs, direct_calls, monkeypatch):
    def make_x(k: int, x=torch.randn(16, 8)) -> torch.Tensor:
        if inputs == "a new tensor":
            return torch.randn(16, 8)
        return x.add_(0.25)
    steps = 6
    direct = run_steps(affine_pair, make_x, steps)
    assert len(direct_calls) == steps - 1  # every call after the first, which records
    monkeypatch.setattr(simaccel.compiled, "direct_replay", lambda program, layout: None)
    general = run_steps(affine_pair, make_x, steps)
    assert len(direct_calls) == steps - 1  # none more
    for key in ("calls", "replayed_calls", "kernel_launches", "host_fallback_ops",
                "h2d.bytes", "h2d.transfers", "d2h.bytes", "d2h.transfers", "compute_items",
                "graphs"):
        assert direct[key] == general[key], key
    assert direct["replayed_calls"] == steps - 1 and direct["host_fallback_ops"] == 0
    assert direct["d2h.bytes"] == steps * (16 * 8 + 16) * 4 and direct["graphs"] == 1


def test_a_bfloat16_output_is_cloned_from_its_storage_view(direct_calls):
    def halve(x: torch.Tensor) -> torch.Tensor:
        return x * 0.5 + 1.0

    compiled = torch.compile(halve, backend="simaccel", dynamic=False)
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    for _ in range(4):
        out = compiled(x)
        assert out.dtype == torch.bfloat16 and out.shape == (8, 16)
        torch.testing.assert_close(out, halve(x), rtol=1.6e-2, atol=1e-2)
    assert len(direct_calls) == 3
    assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 0


def test_an_output_of_eagers_transposed_layout_keeps_the_general_call(direct_calls):
    """A clone would be contiguous; eager's output is not: these calls stay general."""
    def transposed(x: torch.Tensor) -> torch.Tensor:
        return (x + 1.0).t()

    compiled = torch.compile(transposed, backend="simaccel", dynamic=False)
    x = torch.randn(8, 16)
    for _ in range(4):
        out = compiled(x)
        torch.testing.assert_close(out, transposed(x), **TOL)
        assert out.stride() == transposed(x).stride()
    assert not direct_calls
    stats = simaccel.get_device().runtime_stats()
    assert stats["replayed_calls"] == 3 and stats["host_fallback_ops"] == 0


def test_a_reconfigured_device_leaves_the_direct_call_and_finds_it_again(direct_calls):
    import dataclasses

    def affine(x: torch.Tensor) -> torch.Tensor:
        return x * 3.0 - 1.0

    compiled = torch.compile(affine, backend="simaccel", dynamic=False)
    device = simaccel.get_device()
    x = torch.randn(32)
    config = device.config
    try:
        for k in range(8):
            if k == 4:  # a new arena and DMA engine (and a recompile: the config guard)
                device.reconfigure(dataclasses.replace(config, dma_latency_ns=1000.0))
            torch.testing.assert_close(compiled(x), affine(x), **TOL)
    finally:
        device.reconfigure(config)
    # calls 1-3 direct; call 4 recompiles (the config guard) and records; 5-7 direct again
    assert len(direct_calls) == 6


def test_a_lifted_int_and_dynamic_sizes_replay_directly_at_each_sizes_binding(direct_calls):
    """A lifted int (its value rides in the size bank) changing every call, and the
    batch size changing every four calls: the direct replay follows the binding of the
    sizes last called. Per new batch size: a general call binding it, one recording its
    replay (programs with size symbols record at a binding's second call), then direct
    calls; a size bound before replays from its first call back, directly from its second."""
    def fn(x: torch.Tensor, a: float, n: int) -> torch.Tensor:
        return x * a + n

    compiled = torch.compile(fn, backend="simaccel", dynamic=True)
    rows = [4] * 4 + [6] * 4 + [4] * 2
    for k, r in enumerate(rows):
        x = torch.randn(r, 8)
        out = compiled(x, 0.5 + k, k)
        torch.testing.assert_close(out, fn(x, 0.5 + k, k), **TOL)
        assert out.shape == (r, 8)
    assert len(direct_calls) == 2 + 2 + 1
    stats = simaccel.get_device().runtime_stats()
    assert stats["calls"] == len(rows) and stats["replayed_calls"] == 2 + 2 + 2
    assert stats["host_fallback_ops"] == 0
    assert counters["stats"]["unique_graphs"] == 1

"""Symbolic shapes on the device (issue 12): one compile serves every size. Each test
compares with eager and with Dynamo's own ``eager`` backend on the same calls (graph
counts from ``torch._dynamo.utils.counters``), and checks every call ran on the device."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import simaccel
from simaccel.runtime.layout import Layouts
from tests.backend.models import TransformerBlock
from tests.conftest import REDUCTION_TOL
from tests.models.kv_decoder import CachedAttention, StaticCacheAttention

#: 10 distinct batch sizes, including 1 and a prime
BATCHES = (1, 2, 3, 5, 8, 13, 17, 31, 47, 64)


def _graphs(backend: str, fn: Callable[..., Any], calls: list[tuple], dynamic: bool | None,
            compare: bool = True) -> tuple[int, dict[str, int]]:
    """Unique graphs of ``fn`` compiled with ``backend`` over ``calls`` (each result
    compared with eager), and the device's runtime stats of those calls."""
    torch._dynamo.reset()
    counters.clear()
    device = simaccel.get_device()
    device.reset_stats()
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for args in calls:
        got = compiled(*args)
        if compare:
            torch.testing.assert_close(got, fn(*args), **REDUCTION_TOL)
    return counters["stats"]["unique_graphs"], device.runtime_stats()


def _softmax_chain(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(torch.relu(x) * 3, dim=-1)


@pytest.mark.parametrize("dynamic,batches,expected", [
    (None, BATCHES, 2),  # static first, dynamic after the first change
    (True, BATCHES, 2),  # size 1 is specialized (Dynamo's 0/1 rule), 2.. share one graph
    (True, BATCHES[1:], 1),
])
def test_batch_sizes_compile_no_more_graphs_than_dynamo_eager(dynamic, batches, expected):
    calls = [(torch.randn(b, 16),) for b in batches]
    ours, stats = _graphs("simaccel", _softmax_chain, calls, dynamic)
    theirs, _ = _graphs("eager", _softmax_chain, calls, dynamic)
    assert ours <= theirs == expected
    assert stats["calls"] == len(batches) and stats["host_fallback_ops"] == 0
    assert stats["kernel_launches"] >= len(batches)


def test_a_kernel_compiles_once_for_every_size():
    calls = [(torch.randn(b, 16),) for b in BATCHES[1:]]
    _, stats = _graphs("simaccel", _softmax_chain, calls, True)
    report = simaccel.reports()[-1]
    assert stats["kernels_compiled"] + stats["kernel_cache_hits"] + \
        stats["kernel_memory_hits"] == len(report.kernels)  # one compile, all sizes


def test_sizes_reach_the_device_through_the_constant_bank_only_when_they_change():
    """The size symbols go to the device like lifted scalars: in the constant bank, one
    ``const`` transfer at a new size and none at a repeated one, and the kernels read their
    loop bounds from it (its size bank), not from launch arguments."""
    sizes = (4, 4, 6, 6, 6, 9, 4)
    calls = [(torch.randn(b, 16),) for b in sizes]
    torch._dynamo.reset()
    device = simaccel.get_device()
    compiled = torch.compile(_softmax_chain, backend="simaccel", dynamic=True)
    transfers = []
    for args in calls:
        before = device.dma_stats()["const.transfers"]
        torch.testing.assert_close(compiled(*args), _softmax_chain(*args), **REDUCTION_TOL)
        transfers.append(device.dma_stats()["const.transfers"] - before)
    assert transfers == [1, 0, 1, 0, 0, 1, 1]
    report = simaccel.reports()[-1]
    assert report.size_symbols and device.runtime_stats()["host_fallback_ops"] == 0
    sources = [open(k.path).read() for k in report.kernels if k.kind != "library"]
    assert sources and all("= _zb[_zs0]" in src for src in sources)


def _scaled_by_int(x: torch.Tensor, n: int) -> torch.Tensor:
    return torch.sin(x) * n + n


def test_an_int_used_as_a_number_shares_one_layout_across_its_values():
    """An int argument that sizes nothing (lifted: a SymInt from the first compile)
    reaches the kernels through the size bank only: each new value is one ``const``
    transfer, and the call keeps the program's layout, workspace binding and DMA plans
    (one of each) instead of making them again per value."""
    torch._dynamo.reset()
    counters.clear()
    device = simaccel.get_device()
    compiled = torch.compile(_scaled_by_int, backend="simaccel")
    x = torch.randn(64)
    values = (3, 4, 5, 9, 3, 100, -7, 5)
    for i, n in enumerate(values):
        before = device.dma_stats()["const.transfers"]
        torch.testing.assert_close(compiled(x, n), _scaled_by_int(x, n), rtol=1e-6, atol=1e-5)
        if i:  # a transfer iff the value changed
            assert device.dma_stats()["const.transfers"] - before == int(n != values[i - 1])
    assert counters["stats"]["unique_graphs"] == 1
    program = _program_of(simaccel.reports()[-1])
    assert [s.symbol for s in program.spec.symbols] and len(program._bound) == 1
    assert len(program._layouts._cache) == 1
    assert device.runtime_stats()["host_fallback_ops"] == 0


def _decode_grow(layer: CachedAttention, steps: int) -> list[tuple]:
    x = torch.randn(1, 1, 32)
    k = v = torch.zeros(1, 4, 0, 8)
    calls = []
    with torch.no_grad():
        for _ in range(steps):
            calls.append((x, k, v))
            _, k, v = layer.grow(x, k, v)
    return calls


def test_a_kv_cache_grown_by_cat_compiles_no_more_than_dynamo_eager():
    torch.manual_seed(0)
    layer = CachedAttention()
    calls = _decode_grow(layer, 32)[1:]  # from one cached row on
    with torch.no_grad():
        ours, stats = _graphs("simaccel", layer.grow, calls, None)
        theirs, _ = _graphs("eager", layer.grow, calls, None)
    assert ours <= theirs <= 2
    assert stats["host_fallback_ops"] == 0 and stats["calls"] == len(calls)


def test_a_preallocated_kv_cache_written_in_place_equals_eager():
    torch.manual_seed(0)
    layer = CachedAttention()
    x = torch.randn(1, 1, 32)

    def run(backend: str | None) -> tuple[list[torch.Tensor], int]:
        torch._dynamo.reset()
        counters.clear()
        k, v = torch.zeros(1, 4, 16, 8), torch.zeros(1, 4, 16, 8)
        step = layer.write if backend is None else torch.compile(layer.write, backend=backend)
        with torch.no_grad():
            outs = [step(x * (p + 1), k, v, p) for p in range(16)]
        return outs + [k, v], counters["stats"]["unique_graphs"]

    want, _ = run(None)
    got, ours = run("simaccel")
    _, theirs = run("eager")
    torch.testing.assert_close(got, want, **REDUCTION_TOL)
    assert ours <= theirs


def test_a_static_cache_decodes_every_step_in_one_graph_on_the_device():
    """Hugging Face's ``StaticCache`` pattern: buffers written by ``index_copy_`` at a
    position tensor, a mask of the unwritten positions. Every step has the same sizes:
    one graph (as Dynamo's eager backend), outputs and caches equal eager, no fallback."""
    x = torch.randn(1, 1, 32)

    def run(backend: str | None) -> tuple[list[torch.Tensor], int]:
        torch.manual_seed(0)
        layer = StaticCacheAttention(16)
        torch._dynamo.reset()
        counters.clear()
        step = layer if backend is None else torch.compile(layer, backend=backend)
        with torch.no_grad():
            outs = [step(x * (p + 1), torch.tensor([p])) for p in range(12)]
        return outs + [layer.k_cache, layer.v_cache], counters["stats"]["unique_graphs"]

    want, _ = run(None)
    simaccel.get_device().reset_stats()
    got, ours = run("simaccel")
    stats = simaccel.get_device().runtime_stats()
    _, theirs = run("eager")
    torch.testing.assert_close(got, want, **REDUCTION_TOL)
    assert ours == theirs == 1
    assert stats["host_fallback_ops"] == 0 and stats["calls"] == 12
    assert stats["replayed_calls"] > 0 and stats["kernel_launches"] >= 12


def test_training_a_transformer_block_at_three_sequence_lengths():
    torch.manual_seed(0)
    model = TransformerBlock()
    reference = TransformerBlock()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="simaccel")
    torch._dynamo.reset()
    counters.clear()
    for length in (8, 12, 20):
        tokens = torch.randint(0, 50, (2, length))
        for net in (compiled, reference):
            net.zero_grad()
        compiled(tokens).square().mean().backward()
        reference(tokens).square().mean().backward()
        for got, want in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 2  # one static, one dynamic after the change
    backward = [r for r in simaccel.reports() if r.graph.endswith("_backward")]
    assert not backward[-1].host_fallbacks


DYNAMIC_OPS: dict[str, Callable[[torch.Tensor], Any]] = {
    "reductions": lambda x: (x.sum(-1), x.mean(0), x.amax(1), x.var(0), x.argmax(-1)),
    "matmul": lambda x: x @ torch.linspace(-1, 1, 128).view(16, 8),
    "bmm": lambda x: torch.bmm(x.view(1, -1, 16), torch.ones(1, 16, 4)),
    "softmax": lambda x: torch.softmax(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, (16,)),
    "embedding": lambda x: F.embedding((x.abs() * 3).long().clamp(max=9),
                                       torch.arange(40.0).view(10, 4)),
    "cat_stack_split": lambda x: (torch.cat([x, x * 2], 0), torch.stack([x, x], 1),
                                  torch.split(x, 8, 1)[1] * 2),
    "view_reshape": lambda x: (x.reshape(-1, 4, 4).sum(1), x.view(x.shape[0] * 2, 8)),
    "indexing": lambda x: (x[1:, ::2] + x[:-1, 1::2], x[0] + x[-1],
                           torch.gather(x, 1, torch.zeros(x.shape[0], 2, dtype=torch.long))),
    "scan_arange": lambda x: (x.cumsum(0), x + torch.arange(x.shape[0]).unsqueeze(1)),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC_OPS))
def test_ops_over_a_dynamic_dim_compile_once_on_the_device(name):
    calls = [(torch.randn(b, 16),) for b in (5, 9, 14)]
    graphs, stats = _graphs("simaccel", DYNAMIC_OPS[name], calls, True)
    assert graphs == 1
    assert stats["host_fallback_ops"] == 0 and stats["kernel_launches"] >= len(calls)


def _program_of(report: simaccel.CompileReport) -> Any:
    return next(p for p in simaccel.get_device().programs() if p.spec.name == report.graph)


def test_memory_plan_stays_near_the_liveness_bound_at_every_size():
    calls = [(torch.randn(b, 16),) for b in BATCHES[1:]]
    _graphs("simaccel", lambda x: (x.exp() * 2).sum(-1) + x.amax(-1), calls, None)
    program = _program_of(simaccel.reports()[-1])  # dynamic in the batch only
    assert len(program.spec.symbols) == 1
    for batch in BATCHES[1:]:
        plan = program.plan_at((batch,))
        assert plan.total_bytes <= 1.1 * plan.lower_bound_bytes, (batch, plan.summary())
        plan.check()  # no live buffers overlap at this size


def test_pow2_buckets_compile_once_per_bucket_and_plan_for_its_largest_size():
    fn = _softmax_chain
    opts = {"shape_buckets": "pow2"}
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, backend="simaccel", dynamic=True, options=opts)
    for batch in range(3, 65):
        x = torch.randn(batch, 16)
        torch.testing.assert_close(compiled(x), fn(x), **REDUCTION_TOL)
    assert counters["stats"]["unique_graphs"] == 5  # (2,4] (4,8] (8,16] (16,32] (32,64]
    reports = simaccel.reports()[-5:]
    guards = [str(g) for r in reports for g in r.guards.added if "shape_bucket" in str(g)]
    assert any("32 < L['x'].size()[0] <= 64" in g for g in guards), guards
    torch._dynamo.reset()
    static = torch.compile(fn, backend="simaccel", dynamic=False)
    static(torch.randn(64, 16))
    assert reports[-1].memory_plan["planned_bytes"] == \
        simaccel.reports()[-1].memory_plan["planned_bytes"]  # the bucket maximum's plan


def test_a_resident_input_of_a_new_size_gives_its_old_block_back():
    """A static-address input (resident on the device) whose size changes gets a block of
    the new size; the old one is freed, so alternating sizes do not grow device memory."""
    torch._dynamo.reset()
    device = simaccel.get_device()
    compiled = torch.compile(lambda x, c: (x * 2).sum() + c.sum(), backend="simaccel",
                             dynamic=True)
    allocated = []
    for n in (512, 4000, 512, 4000, 512):
        cache = torch.randn(n)
        torch._dynamo.mark_static_address(cache)
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x, cache), (x * 2).sum() + cache.sum(),
                                   **REDUCTION_TOL)
        allocated.append(device.memory_stats()["allocated_bytes.all.current"])
    assert allocated[0] == allocated[2] == allocated[4] < allocated[1] == allocated[3]
    assert device.runtime_stats()["host_fallback_ops"] == 0


def test_a_growing_kv_cache_replaces_its_workspace_a_few_times():
    """Each decode step needs a slightly larger workspace; an outgrown one is replaced
    with headroom (WORKSPACE_GROWTH), so 30 growing steps allocate a handful of
    workspaces, not one per step, and every step equals eager."""
    torch.manual_seed(0)
    layer = CachedAttention()
    calls = _decode_grow(layer, 32)[1:]
    torch._dynamo.reset()
    device = simaccel.get_device()
    compiled = torch.compile(layer.grow, backend="simaccel")
    blocks: dict[str, set] = {}
    with torch.no_grad():
        for args in calls:
            for got, want in zip(compiled(*args), layer.grow(*args)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            for p in device.programs():
                if p._state.workspace is not None:
                    block = p._state.workspace
                    blocks.setdefault(p.spec.name, set()).add((block.offset, block.size))
    dynamic = _program_of(simaccel.reports()[-1])
    assert dynamic.spec.symbols and 1 < len(blocks[dynamic.spec.name]) <= 10, blocks
    assert device.runtime_stats()["host_fallback_ops"] == 0


def _scaled_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    return (x * n).sum(-1) + n


def test_a_program_takes_the_layout_of_each_calls_sizes(monkeypatch):
    """A lifted int only kernels read and a dynamic batch: calls alternate between sizes
    and values; each call gets the layout of its own sizes (the same object while they
    repeat), and every result equals eager."""
    picked = []
    at = Layouts.at

    def recording_at(self, sizes):
        layout = at(self, sizes)
        picked.append((sizes, layout))
        return layout

    monkeypatch.setattr(Layouts, "at", recording_at)
    compiled = torch.compile(_scaled_rows, backend="simaccel", dynamic=True)
    calls = [(4, 3), (4, 3), (4, 5), (7, 5), (4, 3), (7, 2), (7, 2)]
    for batch, n in calls:
        x = torch.randn(batch, 16)
        torch.testing.assert_close(compiled(x, n), _scaled_rows(x, n), rtol=1e-5, atol=1e-5)
    assert len(picked) >= len(calls)
    for sizes, layout in picked:
        assert layout.sizes == sizes
    steady = picked[-len(calls):]
    assert steady[0][1] is steady[1][1] and steady[5][1] is steady[6][1]
    assert steady[1][1] is not steady[2][1]
    # dynamic=True: the row width is a symbol too, beside the batch and the int
    assert all(set(c) <= set(s) for (s, _), c in zip(steady, calls))
    assert counters["stats"]["unique_graphs"] == 1  # one graph served every size and value
    stats = simaccel.get_device().runtime_stats()
    assert stats["host_fallback_ops"] == 0 and stats["kernel_launches"] >= len(calls)
    dma = simaccel.get_device().dma_stats()
    assert dma["h2d.bytes"] > 0 and dma["d2h.bytes"] > 0

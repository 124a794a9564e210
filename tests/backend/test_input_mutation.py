"""Input mutations written back by the program: AOTAutograd keeps ``copy_(input, value)``
in the graph (``keep_inference_input_mutations``), and the device writes the new value
into the caller's tensor at the end of the call (d2h DMA), instead of returning it for
the runtime wrapper to copy. Every test compares with eager on the same calls and checks
the device ran the graph; fused pointwise launches (several kernels, one launch) are
checked here too, since an optimizer step is where they matter."""
from __future__ import annotations

import pytest
import torch
import torch.fx
from torch._dynamo.utils import counters

import simaccel
from simaccel.codegen.graph import GraphLowering
from simaccel.errors import UnsupportedOpError
from simaccel.runtime.group import GroupPart, LaunchGroup

from tests.conftest import POINTWISE_TOL


def _running_update(buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    buf.mul_(0.9).add_(x, alpha=0.1)
    return (x * buf).sum()


def _compiled_calls(fn, make_args, calls: int = 3):
    """``fn`` compiled and eager on equal copies of ``make_args()`` (called twice with
    the same seed) for ``calls`` calls; asserts equal results and equal mutated inputs
    after every call."""
    compiled = torch.compile(fn, backend="simaccel", dynamic=False)
    torch.manual_seed(0)
    ours = make_args()
    torch.manual_seed(0)
    ref = make_args()
    for _ in range(calls):
        torch.testing.assert_close(compiled(*ours), fn(*ref), **POINTWISE_TOL)
        for a, b in zip(ours, ref):
            torch.testing.assert_close(a, b, **POINTWISE_TOL)
    return ours


def test_mutated_input_is_written_back_not_returned():
    torch.manual_seed(0)
    device = simaccel.get_device()
    _compiled_calls(_running_update, lambda: (torch.zeros(64, 32), torch.randn(64, 32)))
    stats, dma = device.runtime_stats(), device.dma_stats()
    assert stats["kernel_launches"] > 0 and stats["host_fallback_ops"] == 0
    # per call: the 4-byte sum and the 8 KB buffer come back; nothing else
    assert dma["d2h.bytes"] == 3 * (4 + 64 * 32 * 4), dma
    assert counters["stats"]["unique_graphs"] == 1


def test_strided_and_misaligned_inputs_get_their_new_values():
    torch.manual_seed(0)
    base = torch.randn(33, 16)

    def make():
        b = base.clone()
        return b[1:].t(), torch.randn(16, 32)  # transposed, 64-byte offset: not aligned

    ours = _compiled_calls(lambda buf, x: buf.add_(x.exp()).sum(), make)
    assert not ours[0].is_contiguous()


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_mutation_in_other_dtypes(dtype):
    def step(counter, x):
        counter.add_(x.to(dtype) * 2)
        return counter.sum()
    _compiled_calls(step, lambda: (torch.zeros(8, 8, dtype=dtype),
                                   torch.arange(64.0).reshape(8, 8)))


def test_zero_dim_state_and_a_value_of_another_dtype():
    """A 0-d step counter (``state["step"] += 1``) and a float written into an int
    tensor (``copy_`` converts, as eager does)."""
    def step(count, ints, x):
        count += 1
        ints.copy_(x * count)
        return x / count
    _compiled_calls(step, lambda: (torch.tensor(0.0), torch.zeros(4, dtype=torch.int64),
                                   torch.tensor([1.5, -2.5, 3.25, 7.0])))


def test_only_copy_may_mutate_an_input():
    """A graph writing into an input any other way (``resize_``, ``set_``) cannot be
    written back from a host copy: an error, never a silent fallback."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.call_function(torch.ops.aten.resize_.default, (x, [4]))
    graph.output(())
    gm = torch.fx.GraphModule({}, graph)
    example = torch.zeros(4)
    x.meta["val"] = example
    with pytest.raises(UnsupportedOpError, match="mutates a graph input"):
        GraphLowering(gm).run([example])


# --------------------------------------------------------------------------- launch groups


def test_optimizer_step_is_two_launches_for_ten_parameters():
    torch.manual_seed(0)
    # 8x8 as in tests/models/optim_steps.py: the same kernel sources (compiled once)
    params = [torch.nn.Parameter(torch.randn(8, 8)) for _ in range(10)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, r in zip(params, ref):
        p.grad = torch.randn_like(p)
        r.grad = p.grad.clone()
    opt = torch.optim.AdamW(params, lr=0.01, foreach=False)
    ref_opt = torch.optim.AdamW(ref, lr=0.01, foreach=False)
    step = torch.compile(opt.step, backend="simaccel")
    device = simaccel.get_device()
    simaccel.clear_reports()
    for i in range(3):
        step()
        ref_opt.step()
        if i == 0:
            device.reset_stats()
    for p, r in zip(params, ref):
        torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)
    stats = device.runtime_stats()
    kernels = [k for r in simaccel.reports() for k in r.kernels]
    # 5 kernels per parameter (the two moment updates share a loop nest: 6 parts), run
    # by 2 launches of at most 32 parts each
    assert len(kernels) == 50 and stats["kernel_launches"] == 2 * 2, stats
    assert stats["host_fallback_ops"] == 0 and stats["resident_uploads"] == 0


def test_launch_group_gives_each_part_its_own_arguments():
    seen = []

    def part(name):
        return lambda *args: seen.append((name, args))

    group = LaunchGroup([GroupPart(part("a"), 2, 1, 0), GroupPart(part("b"), 1, 0, 1),
                         GroupPart(part("c"), 1, 2, 0)])
    args = ("A0", "A1", "B0", "C0", 10, 30, 31, 7)
    group(*args)
    assert seen == [("a", ("A0", "A1", 10)), ("b", ("B0", 7)), ("c", ("C0", 30, 31))]
    seen.clear()
    group.bind(*args)()
    assert [name for name, _ in seen] == ["a", "b", "c"]


def test_mutated_views_of_one_base_are_returned_as_eager_returns_them():
    """Two overlapping views mutated and returned: AOTAutograd merges them into a
    synthetic base and rebuilds each output as a view of it from the output's size,
    stride and storage offset, so the host outputs carry eager's offsets."""
    def fn(x, y):
        return x.add_(1), y.mul_(2)

    compiled = torch.compile(fn, backend="simaccel", dynamic=False)
    ours, ref = torch.arange(16.0), torch.arange(16.0)
    for _ in range(3):
        got, want = compiled(ours[:8], ours[4:12]), fn(ref[:8], ref[4:12])
        torch.testing.assert_close(ours, ref, rtol=0, atol=0)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
            assert g.storage_offset() == w.storage_offset()
    assert simaccel.get_device().runtime_stats()["kernel_launches"] > 0

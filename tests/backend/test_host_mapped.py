"""Host-mapped inputs end to end: a large per-call input only one kernel reads is read in
place from host memory (``DeviceConfig.host_map_min_bytes``), still counted as h2d
traffic, takes no workspace, and every other input is copied as before. Every test
compares with eager and checks the device ran the graph."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch._dynamo.utils import counters

import simaccel
import simaccel.runtime.program as program_module

from tests.conftest import REDUCTION_TOL

#: the threshold the tests map at: a 32x64 float32 input (8192 bytes) qualifies
MIN_BYTES = 4096
SHAPE = (32, 64)
INPUT_BYTES = 32 * 64 * 4


def row_reductions(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x.sum(-1), x.amax(-1), x.mean(-1)  # one fused kernel reads x


def run(fn: Callable[..., Any], *inputs: torch.Tensor, calls: int = 3
        ) -> tuple[dict[str, Any], simaccel.CompileReport]:
    """Compile ``fn``, call it ``calls`` times on ``inputs`` comparing with eager; returns
    the DMA stats of those calls and the compile report."""
    device = simaccel.get_device()
    device.reset_stats()
    compiled = torch.compile(fn, backend="simaccel", dynamic=False)
    for _ in range(calls):
        torch.testing.assert_close(compiled(*inputs), fn(*inputs), **REDUCTION_TOL)
    assert device.runtime_stats()["kernel_launches"] >= calls
    assert counters["stats"]["unique_graphs"] == 1
    return device.dma_stats(), simaccel.reports()[-1]


def test_large_input_read_by_one_kernel_is_mapped_not_copied():
    x = torch.randn(*SHAPE)
    with simaccel.configure(host_map_min_bytes=0):
        _, copied = run(row_reductions, x, calls=1)
    torch._dynamo.reset()
    counters.clear()
    with simaccel.configure(host_map_min_bytes=MIN_BYTES):
        dma, report = run(row_reductions, x)
    assert simaccel.get_device().runtime_stats()["kernel_launches"] == 3  # one fused kernel
    assert (dma["h2d.mapped_bytes"], dma["h2d.mapped_reads"]) == (3 * INPUT_BYTES, 3)
    assert dma["h2d.bytes"] == 3 * INPUT_BYTES  # the bytes still cross the bus
    assert dma["h2d.transfers"] == 3  # one submit per call
    assert [(i, n) for i, _, n in report.host_mapped] == [(0, INPUT_BYTES)]
    assert "host-mapped inputs" in str(report) and not copied.host_mapped
    planned, before = report.memory_plan["planned_bytes"], copied.memory_plan["planned_bytes"]
    assert planned == before - INPUT_BYTES


def test_gemm_operands_are_mapped():
    """A float GEMM (a library call) writes only its output: its large operands are read in
    place, the result equals eager."""
    x, w = torch.randn(*SHAPE), torch.randn(SHAPE[1], SHAPE[0])
    with simaccel.configure(host_map_min_bytes=MIN_BYTES):
        dma, report = run(torch.mm, x, w)
    assert sorted(i for i, _, _ in report.host_mapped) == [0, 1]
    assert dma["h2d.mapped_bytes"] == 3 * 2 * INPUT_BYTES


TEMPLATE_READERS: dict[str, tuple[Callable[..., Any], Callable[[], torch.Tensor]]] = {
    "conv2d": (lambda x: torch.nn.functional.conv2d(x, torch.ones(4, 3, 3, 3) / 27, padding=1),
               lambda: torch.randn(2, 3, 16, 16)),
    "max_pool2d": (lambda x: torch.nn.functional.max_pool2d(x, 2),
                   lambda: torch.randn(2, 4, 16, 16)),
    "avg_pool2d": (lambda x: torch.nn.functional.avg_pool2d(x, 2),
                   lambda: torch.randn(2, 4, 16, 16)),
    "adaptive_avg_pool2d": (lambda x: torch.nn.functional.adaptive_avg_pool2d(x, 3),
                            lambda: torch.randn(2, 4, 16, 16)),
    "cumsum": (lambda x: torch.cumsum(x, 1), lambda: torch.randn(*SHAPE)),
}


@pytest.mark.parametrize("case", sorted(TEMPLATE_READERS))
def test_template_kernel_inputs_are_mapped(case):
    """Templates declare what they write (their outputs and scratch), so the large input
    they read is read in place; results equal eager."""
    fn, make = TEMPLATE_READERS[case]
    x = make()
    with simaccel.configure(host_map_min_bytes=MIN_BYTES):
        dma, report = run(fn, x)
    assert [i for i, _, _ in report.host_mapped] == [0], report.host_mapped
    assert dma["h2d.mapped_bytes"] == 3 * x.numel() * 4


def test_an_input_also_returned_as_a_view_is_mapped():
    """The view is made on the host (simaccel.codegen.input_views), so the device only
    reads the input: it is read in place, and the view is the caller's memory."""
    x = torch.randn(*SHAPE)
    with simaccel.configure(host_map_min_bytes=MIN_BYTES):
        dma, report = run(lambda x: (x.sum(-1), x.detach()), x)
    assert [i for i, _, _ in report.host_mapped] == [0]
    assert dma["h2d.mapped_bytes"] == dma["h2d.bytes"] == 3 * INPUT_BYTES
    assert dma["d2h.bytes"] == 3 * SHAPE[0] * 4  # the sums only


def test_same_tensor_binds_once_and_new_tensors_are_patched_in(monkeypatch):
    """The kernel reading the input in place is bound once; a new tensor at another
    address is patched into that launch (its pointer stored), not bound again."""
    binds: list[Any] = []
    real_bind = program_module.bind_launch
    monkeypatch.setattr(program_module, "bind_launch",
                        lambda fn, args, *addresses: binds.append(fn) or real_bind(fn, args, *addresses))
    with simaccel.configure(host_map_min_bytes=MIN_BYTES):
        x = torch.randn(*SHAPE)
        dma, report = run(row_reductions, x, calls=4)
        assert len(binds) == 1 and report.host_mapped
        compiled = torch.compile(row_reductions, backend="simaccel", dynamic=False)
        for k in range(3):  # a new tensor each call: correct results, the launch patched
            fresh = torch.randn(*SHAPE) + k
            torch.testing.assert_close(compiled(fresh), row_reductions(fresh), **REDUCTION_TOL)
        assert len(binds) == 1
        assert simaccel.get_device().dma_stats()["h2d.mapped_reads"] == 7
    assert dma["h2d.mapped_bytes"] == 4 * INPUT_BYTES


def _misaligned() -> torch.Tensor:
    """A view at an odd offset (4 bytes past an aligned allocation): a staged copy."""
    return torch.randn(SHAPE[0] * SHAPE[1] + 1)[1:].view(*SHAPE)


COPIED: dict[str, tuple[Callable[..., Any], Callable[[], torch.Tensor], int]] = {
    # name: (fn, input factory, host_map_min_bytes)
    "read_by_two_kernels": (lambda x: (x.sum(-1), x.argmax(-1)), lambda: torch.randn(*SHAPE),
                            MIN_BYTES),
    "read_by_a_host_fallback": (lambda x: (x.sum(-1), torch.mode(x, -1).values),
                                lambda: torch.randn(*SHAPE), MIN_BYTES),
    "misaligned_view": (row_reductions, _misaligned, MIN_BYTES),
    # a transposed view: the copy gathers it into C order; a kernel cannot read it in place
    "transposed_view": (row_reductions, lambda: torch.randn(SHAPE[1], SHAPE[0]).t(), MIN_BYTES),
    "below_threshold": (row_reductions, lambda: torch.randn(*SHAPE), INPUT_BYTES + 1),
    "mapping_disabled": (row_reductions, lambda: torch.randn(*SHAPE), 0),
}


@pytest.mark.parametrize("case", sorted(COPIED))
def test_inputs_that_do_not_qualify_are_copied_as_before(case):
    fn, make, min_bytes = COPIED[case]
    x = make()
    with simaccel.configure(host_map_min_bytes=min_bytes):
        dma, report = run(fn, x, calls=2)
    assert report.host_mapped == []
    assert (dma["h2d.mapped_bytes"], dma["h2d.mapped_reads"]) == (0, 0)
    assert dma["h2d.bytes"] >= 2 * INPUT_BYTES  # copied in on every call
    if case == "misaligned_view":
        assert dma["staged.bytes"] == 2 * INPUT_BYTES
    if case == "read_by_a_host_fallback":
        assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 2


def test_changing_the_threshold_recompiles_once():
    x = torch.randn(*SHAPE)
    compiled = torch.compile(row_reductions, backend="simaccel", dynamic=False)
    device = simaccel.get_device()
    torch.testing.assert_close(compiled(x), row_reductions(x), **REDUCTION_TOL)
    assert device.dma_stats()["h2d.mapped_reads"] == 0  # 8 KB: below the 1 MB default
    with simaccel.configure(host_map_min_bytes=MIN_BYTES):
        for _ in range(3):
            torch.testing.assert_close(compiled(x), row_reductions(x), **REDUCTION_TOL)
        assert counters["stats"]["unique_graphs"] == 2
        assert simaccel.reports()[-1].host_mapped
    assert device.dma_stats()["h2d.mapped_reads"] == 3
    torch.testing.assert_close(compiled(x), row_reductions(x), **REDUCTION_TOL)
    assert counters["stats"]["unique_graphs"] == 2  # the old config's graph, copying again
    assert device.dma_stats()["h2d.mapped_reads"] == 3
    assert device.runtime_stats()["kernel_launches"] == 5


def _conv_weight_grad(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.conv2d(x, w, padding=1).sum()


def _max_pool_grad(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.max_pool2d(x, 2).sum()


#: case -> (function, its inputs, the backward's mapped input, mapped reads of both graphs)
BACKWARD_READERS: dict[str, tuple[Callable[..., Any], Callable[[], list[torch.Tensor]], int,
                                  int]] = {
    # conv2d_backward reads the forward's input x (a saved forward input: its alignment
    # is pinned by the frame's guard) to form the weight gradient; x needs no grad. The
    # forward saves x itself (no output of its own: simaccel.codegen.input_views), and its
    # conv reads x in place too: two mapped reads.
    "conv2d_backward": (_conv_weight_grad,
                        lambda: [torch.randn(2, 3, 16, 16),
                                 torch.randn(4, 3, 3, 3, requires_grad=True)], 0, 2),
    # max_pool2d_backward reads the saved indices (a forward output simaccel allocated:
    # aligned by construction), its backward input 1; the forward's pool reads x in place
    "max_pool2d_backward": (_max_pool_grad,
                            lambda: [torch.randn(2, 4, 16, 16, requires_grad=True)], 1, 2),
}


@pytest.mark.parametrize("case", sorted(BACKWARD_READERS))
def test_backward_template_inputs_are_mapped(case):
    """Backward templates declare what they write too, and a backward graph's inputs get
    their facts at compile time from what they are in the forward graph: a large saved
    tensor only the template reads is read in place. Gradients equal eager."""
    fn, make, mapped_input, mapped_reads = BACKWARD_READERS[case]
    inputs = make()
    reference = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    fn(*reference).backward()
    compiled = torch.compile(fn, backend="simaccel", dynamic=False)
    device = simaccel.get_device()
    with simaccel.configure(host_map_min_bytes=MIN_BYTES):
        device.reset_stats()
        compiled(*inputs).backward()
    for got, want in zip(inputs, reference):
        if want.requires_grad:
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-4)
    backward = [r for r in simaccel.reports() if r.graph.endswith("_backward")][-1]
    assert [i for i, _, _ in backward.host_mapped] == [mapped_input], backward.host_mapped
    assert device.dma_stats()["h2d.mapped_reads"] == mapped_reads
    assert device.runtime_stats()["kernel_launches"] > 0
    assert device.runtime_stats()["host_fallback_ops"] == 0
    assert device.runtime_stats()["memory_plans"] == 2  # each graph planned once


def test_an_input_of_dynamic_size_is_mapped_at_every_size():
    """A contiguous input over dynamic sizes is mapped too (its strides are provably C
    order for every size): each call maps its rows in place, whatever their count."""
    device = simaccel.get_device()
    compiled = torch.compile(row_reductions, backend="simaccel", dynamic=True)
    mapped = []
    with simaccel.configure(host_map_min_bytes=MIN_BYTES):
        for rows in (32, 40, 57, 40):
            x = torch.randn(rows, 64)
            before = device.dma_stats()["h2d.mapped_bytes"]
            torch.testing.assert_close(compiled(x), row_reductions(x), **REDUCTION_TOL)
            mapped.append(device.dma_stats()["h2d.mapped_bytes"] - before)
    assert mapped == [rows * 64 * 4 for rows in (32, 40, 57, 40)]
    report = simaccel.reports()[-1]
    assert report.size_symbols and len(report.host_mapped) == 1  # x (after the sizes)
    assert counters["stats"]["unique_graphs"] == 1
    assert device.runtime_stats()["host_fallback_ops"] == 0

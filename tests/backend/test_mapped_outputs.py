"""Host-mapped outputs end to end: a large output written by one compiled kernel is
written in place into the tensor the call returns (``DeviceConfig.host_map_min_bytes``),
counted as d2h traffic, takes no workspace, and is never a memory a later call writes
again. Every test compares with eager and checks the device ran the graph."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import simaccel

from tests.conftest import POINTWISE_TOL

#: the threshold the tests map at: a 32x64 float32 output (8192 bytes) qualifies
MIN_BYTES = 4096
SHAPE = (32, 64)
OUTPUT_BYTES = 32 * 64 * 4
#: softmax rows of 64 reordered sums (float32)
ROW_TOL = {"rtol": 1e-4, "atol": 1e-5}


def chain(x: torch.Tensor) -> torch.Tensor:
    # no cancellation that would amplify a fast helper's ulp (a sqrt near 0 would)
    return torch.sigmoid(x * 2.0 + 1.0) * 3.0 - x


def compiled_twice(fn, min_bytes: int, *args: torch.Tensor):
    """``fn`` compiled at ``min_bytes``, run once; (compiled, its report)."""
    torch._dynamo.reset()
    counters.clear()
    with simaccel.configure(host_map_min_bytes=min_bytes):
        compiled = torch.compile(fn, backend="simaccel", dynamic=False)
        compiled(*args)
    return compiled, simaccel.reports()[-1]


def test_a_large_output_is_written_in_place_into_each_calls_new_tensor():
    x1, x2, x3 = (torch.randn(*SHAPE) for _ in range(3))
    _, copied = compiled_twice(chain, 0, x1)
    device = simaccel.get_device()
    with simaccel.configure(host_map_min_bytes=MIN_BYTES):
        compiled = torch.compile(chain, backend="simaccel", dynamic=False)
        torch._dynamo.reset()
        device.reset_stats()
        outs = [compiled(x) for x in (x1, x2, x3)]
        report = simaccel.reports()[-1]
        dma = device.dma_stats()
    for out, x in zip(outs, (x1, x2, x3)):  # each call's own memory: none overwritten
        torch.testing.assert_close(out, chain(x), **POINTWISE_TOL)
    assert len({o.data_ptr() for o in outs}) == 3
    assert [(k, n) for k, _, n in report.host_mapped_outputs] == [(0, OUTPUT_BYTES)]
    assert "host-mapped outputs" in str(report) and not copied.host_mapped_outputs
    assert (dma["d2h.mapped_writes"], dma["d2h.mapped_bytes"]) == (3, 3 * OUTPUT_BYTES)
    assert dma["d2h.bytes"] == 3 * OUTPUT_BYTES  # the bytes still cross the bus
    assert device.runtime_stats()["kernel_launches"] == 3
    # its one kernel reads the input and writes the output in place: no device memory
    assert [i for i, _, _ in report.host_mapped] == [0]
    assert report.memory_plan["planned_bytes"] == 0
    assert copied.memory_plan["planned_bytes"] == 2 * OUTPUT_BYTES


def test_a_softmax_row_kernel_writes_its_output_and_reused_exp_in_place():
    """The row kernel's sum pass stores exp(x - max) into the output for the output
    pass (codegen.row_reuse): with the output mapped, both passes use the caller's
    memory."""
    x = torch.randn(8, 16, 64) * 3
    mask = torch.rand(8, 16, 64) < 0.25

    def fn(x, mask):
        return torch.softmax(x.masked_fill(mask, -math.inf), -1)
    compiled, report = compiled_twice(fn, MIN_BYTES, x, mask)
    assert [k for k, _, _ in report.host_mapped_outputs] == [0]
    assert [k.kind for k in report.kernels] == ["row"]
    for _ in range(2):
        x = torch.randn(8, 16, 64) * 3
        torch.testing.assert_close(compiled(x, mask), fn(x, mask), **ROW_TOL)


def test_a_bfloat16_output_is_mapped_as_its_bits():
    x = torch.randn(64, 64).to(torch.bfloat16)
    compiled, report = compiled_twice(lambda x: F.gelu(x) * 2.0, MIN_BYTES, x)
    assert [k for k, _, _ in report.host_mapped_outputs] == [0]
    out = compiled(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, F.gelu(x) * 2.0, rtol=1.6e-2, atol=1e-2)


def test_a_transposed_output_stays_a_device_copy():
    """Eager returns x.t() + 1 with transposed strides: the host tensor is not in the
    kernel's C order, so the output is copied back as before."""
    x = torch.randn(*SHAPE)
    compiled, report = compiled_twice(lambda x: (x + 1.0).t(), MIN_BYTES, x)
    assert report.host_mapped_outputs == []
    out = compiled(x)
    torch.testing.assert_close(out, (x + 1.0).t(), rtol=0, atol=0)
    assert out.stride() == (x + 1.0).t().stride()


def test_a_large_library_output_is_mapped_and_a_small_one_copied():
    """A library call computes into a tensor of its own: its output is mapped (copied once,
    into the call's tensor) only from LIBRARY_MAPPED_MIN_BYTES on, where the copy saved
    outweighs rebinding the call's views per call."""
    from simaccel.codegen.compile import LIBRARY_MAPPED_MIN_BYTES

    def grouped(x, w):
        return F.conv2d(x, w, padding=1, groups=8)

    w = torch.randn(64, 8, 3, 3) * 0.1
    large = torch.randn(2, 64, 96, 96)  # a 4.5 MiB output
    small = torch.randn(2, 64, 8, 8)
    assert large.nbytes >= LIBRARY_MAPPED_MIN_BYTES > small.nbytes
    for x, mapped in ((large, True), (small, False)):
        compiled, report = compiled_twice(grouped, MIN_BYTES, x, w)
        for _ in range(2):
            out, expected = compiled(x, w), grouped(x, w)
            assert out.shape == expected.shape and out.dtype == expected.dtype
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        assert bool(report.host_mapped_outputs) is mapped
        assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 0

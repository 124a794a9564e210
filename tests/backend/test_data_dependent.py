"""Data-dependent sizes on the device (issue 12, item 5): ``.item()`` used as a size,
boolean masks, ``nonzero``, ``masked_select`` compile as a staged program (device stage,
a readback of the count, device stage). Each case is compared with eager and with
Dynamo's own ``eager`` backend on the same calls, and checked to have run on the device
(kernels launched, the count read back by DMA, no host fallback op)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

import simaccel
from simaccel.errors import UnsupportedOpError
from tests.conftest import REDUCTION_TOL

#: input sizes of the calls; the data (and so every count) differs per call
SIZES = (6, 9, 13)

#: (``x[x > 0]`` alone and ``nonzero(x > 0)`` are covered by ``two_masks``, the
#: one-compile test and ``nonzero_2d``)
CASES: dict[str, tuple[Callable[..., Any], Callable[[int], tuple]]] = {
    "item_as_size": (lambda x: torch.zeros(int((x > 0).sum().item())) + 1,
                     lambda n: (torch.randn(n),)),
    "arange_of_item": (lambda x: (torch.arange(x.abs().sum().to(torch.int64).item()) * 2.0,
                                  x * 3),
                       lambda n: (torch.randn(n),)),
    "int_item_returned": (lambda x: ((x > 0).sum().item(), x + 1),
                          lambda n: (torch.randn(n),)),
    "mask_2d": (lambda x: x[x > 0] + 1, lambda n: (torch.randn(n, 5),)),
    "mask_rows": (lambda x: x[x[:, 0] > 0] * 2, lambda n: (torch.randn(n, 5),)),
    "mask_after_slice": (lambda x: x[:, x[0] > 0], lambda n: (torch.randn(3, n),)),
    "mask_empty": (lambda x: x[x > 100] * 2, lambda n: (torch.randn(n),)),
    "two_masks": (lambda x: (x[x > 0].sum(), x[x < 0].mean()), lambda n: (torch.randn(n),)),
    "int_mask": (lambda x: x[x % 2 == 0] // 2, lambda n: (torch.arange(n),)),
    "nonzero_2d": (lambda x: torch.nonzero(x), lambda n: (torch.randn(n, 4).clamp(min=0),)),
    "masked_select": (lambda x: torch.masked_select(x, x > 0.5), lambda n: (torch.randn(n, 3),)),
}

CAPTURE = {"capture_scalar_outputs": True, "capture_dynamic_output_shape_ops": True}


def _run(backend: str, fn: Callable[..., Any], make: Callable[[int], tuple],
         dynamic: bool | None = True) -> int:
    """Unique graphs over the calls of :data:`SIZES` (each result equal to eager); the
    input sizes are dynamic from the first call (one graph) unless ``dynamic`` says."""
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(**CAPTURE):
        compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
        for n in SIZES:
            torch.manual_seed(n)
            args = make(n)
            torch.testing.assert_close(compiled(*args), fn(*args), **REDUCTION_TOL)
    return counters["stats"]["unique_graphs"]


def _on_the_device(fn: Callable[..., Any], make: Callable[[int], tuple]) -> dict[str, int]:
    """Run ``fn`` with Dynamo's eager backend, then with simaccel, on the same calls:
    no more graphs than Dynamo eager, every call on the device; the device's stats."""
    dynamo_eager = _run("eager", fn, make)
    device = simaccel.get_device()
    device.reset_stats()
    assert _run("simaccel", fn, make) <= dynamo_eager
    stats = device.runtime_stats()
    assert stats["kernel_launches"] > 0 and stats["host_fallback_ops"] == 0
    return stats


@pytest.mark.parametrize("case", sorted(CASES))
def test_data_dependent_sizes_run_on_the_device_and_equal_eager(case):
    stats = _on_the_device(*CASES[case])
    dma = simaccel.get_device().dma_stats()
    # each call reads at least one count back (d2h), after the first device stage
    assert stats["size_readbacks"] >= len(SIZES)
    assert dma["d2h.transfers"] >= len(SIZES)
    staged = [r for r in simaccel.reports()[-4:] if r.stages]
    assert staged and any("host stage" in s for s in staged[-1].stages)


def test_a_mask_assignment_scatters_on_the_device():
    """``x[mask] += v`` (one row broadcast to every set row) and ``y[mask] = values`` (a
    row per set flag, counted first) both run on the device."""
    def broadcast_row(x, v):
        return torch.index_put(x, [x[:, 0] > 0], v, accumulate=True)

    def row_per_flag(x):
        y = x.clone()
        y[x > 0] = torch.arange(int((x > 0).sum().item()), dtype=x.dtype)
        return y
    for fn, make in ((broadcast_row, lambda n: (torch.randn(n, 3), torch.randn(1, 3))),
                     (row_per_flag, lambda n: (torch.randn(n, 2),))):
        _on_the_device(fn, make)


def test_one_compile_serves_every_count():
    """The stage after the readback takes the count as a size: new counts compile
    nothing (no graph, no kernel), over 12 calls of one input size."""
    fn = lambda x: (x[x > 0] * 2).sum() + x.mean()  # noqa: E731
    torch._dynamo.reset()
    device = simaccel.get_device()
    with torch._dynamo.config.patch(**CAPTURE):
        compiled = torch.compile(fn, backend="simaccel")
        x = torch.randn(64)
        torch.testing.assert_close(compiled(x), fn(x), **REDUCTION_TOL)
        before = device.runtime_stats()
        device.dma.reset_stats()
        counts = set()
        for seed in range(12):
            torch.manual_seed(seed)
            x = torch.randn(64)
            counts.add(int((x > 0).sum()))
            torch.testing.assert_close(compiled(x), fn(x), **REDUCTION_TOL)
        after = device.runtime_stats()
    assert len(counts) > 3
    assert after["graphs_compiled"] == before["graphs_compiled"]
    assert after["kernels_compiled"] == before["kernels_compiled"]
    assert after["size_readbacks"] - before["size_readbacks"] == 12
    # the count is one int64 read back per call, by the DMA engine
    counts_read = [e for e in device.dma.trace_events()
                   if e.cat == "d2h" and e.args.get("bytes") == 8]
    assert len(counts_read) == 12


def test_training_through_a_boolean_mask_equals_eager():
    """The backward of ``h[h > 0]`` scatters the gradient through the mask on the device
    (its row count is the forward's count)."""
    def fn(x, w):
        h = x @ w
        sel = h[h > 0]
        return (sel * sel).sum() + h.mean()
    torch._dynamo.reset()
    device = simaccel.get_device()
    device.reset_stats()
    with torch._dynamo.config.patch(**CAPTURE):
        compiled = torch.compile(fn, backend="simaccel")
        for n in (6, 9, 13):
            torch.manual_seed(n)
            x, w = torch.randn(n, 4), torch.randn(4, 3, requires_grad=True)
            w_ref = w.detach().clone().requires_grad_()
            compiled(x, w).backward()
            fn(x, w_ref).backward()
            torch.testing.assert_close(w.grad, w_ref.grad, **REDUCTION_TOL)
    stats = device.runtime_stats()
    assert stats["host_fallback_ops"] == 0 and stats["kernel_launches"] > 0


def test_an_op_no_kernel_counts_runs_on_the_host_with_its_reason():
    fn = lambda x: torch.unique(x) * 2  # noqa: E731
    torch._dynamo.reset()
    device = simaccel.get_device()
    device.reset_stats()
    with torch._dynamo.config.patch(**CAPTURE):
        compiled = torch.compile(fn, backend="simaccel")
        for n in (6, 9):
            x = torch.randint(0, 4, (n,))
            torch.testing.assert_close(compiled(x), fn(x))
    reasons = [reason for r in simaccel.reports()[-3:] for _, reason in r.host_fallbacks]
    assert any("_unique2" in r and "data-dependent" in r for r in reasons), reasons
    assert device.runtime_stats()["host_fallback_ops"] > 0
    torch._dynamo.reset()
    with torch._dynamo.config.patch(**CAPTURE), pytest.raises(UnsupportedOpError,
                                                              match="_unique2"):
        torch.compile(fn, backend="simaccel", options={"fallback": "error"})(x)


def test_a_size_assertion_is_checked_on_every_call():
    """``torch._check`` on a data-dependent size raises as eager does when it fails, and
    the device stays usable."""
    def fn(x):
        n = int((x > 0).sum().item())
        torch._check(n <= 5)
        return torch.ones(n) * 2
    torch._dynamo.reset()
    with torch._dynamo.config.patch(**CAPTURE):
        compiled = torch.compile(fn, backend="simaccel")
        x = torch.tensor([1.0, -1.0, 2.0])
        torch.testing.assert_close(compiled(x), fn(x))
        with pytest.raises(RuntimeError):
            compiled(torch.ones(8))
        torch.testing.assert_close(compiled(x), fn(x))


def test_a_float_item_needs_no_stage():
    """A float ``.item()`` is not a size: the device computes it inside its kernels, in
    one program (no readback)."""
    fn = lambda x: (x * x.sum().item(), x.sum().item())  # noqa: E731
    assert _on_the_device(fn, lambda n: (torch.randn(n),))["size_readbacks"] == 0

"""Column reductions (:mod:`simaccel.codegen.emit_columns`): a reduction over a
dimension outside the contiguous one runs row by row over a chunk of accumulators.
Compiled kernels (tier 0 off) equal eager; the order is chosen for exactly the
reductions it helps; a long float32 column sum is no less accurate than eager's."""
from __future__ import annotations

import pathlib

import pytest
import torch
from torch._dynamo.utils import counters

import simaccel
from simaccel.codegen.emit_columns import CHUNK, column_order
from simaccel.codegen.graph import GraphLowering
from simaccel.codegen.ir import ReductionKernel
from tests.conftest import REDUCTION_TOL

#: the chunk loop of a column reduction's source
COLUMN_LOOP = "for oc in"


def _compiled_sources(fn, *args, dynamic: bool = False) -> tuple[list, list[str]]:
    """``fn``'s outputs compiled with numba's kernels from the first call (equal to eager,
    on the device, no host fallback) and its kernel sources."""
    torch._dynamo.reset()
    counters.clear()
    simaccel.clear_reports()
    device = simaccel.get_device()
    device.reset_stats()
    compiled = torch.compile(fn, backend="simaccel", dynamic=dynamic,
                             options={"tier0": False})
    outputs = compiled(*args)
    expected = fn(*args)
    for out, ref in zip(outputs, expected):
        assert out.shape == ref.shape and out.dtype == ref.dtype
        torch.testing.assert_close(out, ref, **REDUCTION_TOL)
    stats = device.runtime_stats()
    assert stats["kernel_launches"] > 0 and stats["host_fallback_ops"] == 0, stats
    assert device.dma_stats()["h2d.bytes"] > 0
    sources = [pathlib.Path(k.path).read_text() for r in simaccel.reports() for k in r.kernels
               if k.path.endswith(".py")]
    return outputs, sources


def _bias_grads(a, b, c):
    return ((a * b).sum(0), torch.where(c > 0, a, 0.0).sum(0), (a + 1).amax(0),
            (a - b).amin(0, keepdim=True), (a > 1).any(0), (a > -3).all(0),
            (1 + a / 100).prod(0))


@pytest.mark.parametrize("shape", [(64, 512), (7, 300), (1000, 768), (3, 16)])
def test_column_sums_and_extrema_equal_eager(shape):
    """Chunk boundaries (300 and 768 columns are not multiples of the chunk), a large one
    (prange over chunks) and the narrowest column order takes."""
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(shape, generator=gen) for _ in range(3)]
    _, sources = _compiled_sources(_bias_grads, *args)
    assert any(COLUMN_LOOP in s for s in sources)
    if shape[1] > 2 * CHUNK and shape[0] * shape[1] > 500_000:
        assert any(COLUMN_LOOP in s and "parallel=True" in s for s in sources)


def test_middle_dimension_and_dynamic_rows():
    """A 3-D tensor summed over its middle dimension, and a dynamic row count (a batch
    that changes: one graph for both)."""
    def fn(x, y):
        return x.sum(1), y.sum(0)

    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 33, 40, generator=gen), torch.randn(50, 96, generator=gen)
    _, sources = _compiled_sources(fn, x, y, dynamic=True)
    assert sum(COLUMN_LOOP in s for s in sources) >= 1
    compiled = torch.compile(fn, backend="simaccel", dynamic=True, options={"tier0": False})
    for rows in (50, 17, 130):
        y = torch.randn(rows, 96, generator=gen)
        for out, ref in zip(compiled(x, y), fn(x, y)):
            torch.testing.assert_close(out, ref, **REDUCTION_TOL)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("rows", [64, 256, 4000])
def test_float32_sums_accumulate_in_float64(rows):
    """Each output adds its rows one after the other, in float64: the error against the
    exact sum stays within eager's (its cascade of float32 partial sums)."""
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(rows, 300, generator=gen) * 100 + 1000
    (ours,), sources = _compiled_sources(lambda x: (x.sum(0),), x)
    (source,) = [s for s in sources if COLUMN_LOOP in s]
    assert "np.empty(on, np.float64)" in source
    exact = x.double().sum(0)
    eager = (x.sum(0).double() - exact).abs().max()
    assert (ours.double() - exact).abs().max() <= 2 * eager + 1e-3


def _reductions(fn, *args) -> list[ReductionKernel]:
    gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(*args)
    steps = GraphLowering(gm).run(list(args)).steps
    return [s for s in steps if isinstance(s, ReductionKernel)]


def test_order_is_chosen_for_column_reductions_only():
    x = torch.randn(64, 512)
    (rows,) = _reductions(lambda x: x.sum(1), x)
    (columns,) = _reductions(lambda x: x.sum(0), x)
    (narrow,) = _reductions(lambda x: x.sum(0), torch.randn(64, 8))
    (arg,) = _reductions(lambda x: x.argmax(0), x)
    assert not column_order(rows) and column_order(columns)
    assert not column_order(narrow) and not column_order(arg)

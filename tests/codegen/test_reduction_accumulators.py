"""Reduction accumulators: float32 rows up to FLOAT32_SUM_MAX sum in float32 (as eager
does) with an error no larger than eager's, longer rows in float64; max/min keep NaN;
kernels never compile with kernel-wide fastmath (only the sum's accumulation
reassociates)."""
from __future__ import annotations

import pathlib

import pytest
import torch

from simaccel.codegen.lower_reduce import FLOAT32_SUM_MAX
from tests.conftest import REDUCTION_TOL, check


def _sources(result) -> list[str]:
    return [pathlib.Path(k.path).read_text() for r in result.reports for k in r.kernels]


@pytest.mark.parametrize("length, acc", [(1024, "float32"), (FLOAT32_SUM_MAX + 1, "float64")])
def test_accumulator_dtype_by_row_length(length: int, acc: str) -> None:
    x = torch.rand(64, length, generator=torch.Generator().manual_seed(0)) * 100 + 1000
    result = check(lambda x: (x.sum(-1), x.mean(-1)), x, **REDUCTION_TOL)
    (source,) = _sources(result)
    assert f"acc0 = np.{acc}(0.0)" in source
    assert "fastmath" not in source
    exact = x.double().sum(-1)
    ours = (result.outputs[0].double() - exact).abs().max()
    eager = (x.sum(-1).double() - exact).abs().max()
    assert ours <= 2 * eager + 1e-3


def test_max_and_min_reductions_keep_nan() -> None:
    x = torch.randn(32, 300)
    x[3, 17] = float("nan")
    x[9, 299] = float("nan")
    x[20] = float("-inf")
    result = check(lambda x: (x.amax(-1), x.amin(-1), x.sum(-1)), x, **REDUCTION_TOL)
    assert len(_sources(result)) == 1  # one fused kernel
    for out in result.outputs[:2]:
        assert torch.isnan(out).nonzero().flatten().tolist() == [3, 9]

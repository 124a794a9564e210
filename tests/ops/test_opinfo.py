"""PyTorch's OpInfo database as simaccel's op-coverage suite.

Each OpInfo sample is compiled with ``backend="simaccel"``, run, compared with eager
(the OpInfo's tolerances, see :func:`tests.ops.sweep.tolerance`) and the op classified
device / host / error by what ran (``runtime_stats()["kernel_launches"]``,
``["host_fallback_ops"]`` and the compile reports' host fallbacks; see
:mod:`tests.ops.sweep`). An op that runs on the host must be in
:data:`tests.ops.known_host_ops.KNOWN_HOST_OPS` with its reason, so a regression fails;
a known host op that now runs on the device is listed at the end of the run (an
improvement: take it out of the table). The run ends with the sweep's table.

By default a fast subset runs (the op families simaccel lowers with templates, one sample
each, a few with backward and in bfloat16). ``SIMACCEL_OPINFO=full`` (or ``-m opinfo_full``
selecting nothing else: the marker only labels) sweeps every op in float32 forward, with
backward, and in bfloat16; ``SIMACCEL_OPINFO_SAMPLES`` sets the samples per op (1).
"""
from __future__ import annotations

import os
from dataclasses import asdict

import pytest
import torch

from tests.ops.known_host_ops import (KNOWN_HOST_OPS, KNOWN_HOST_OPS_BACKWARD,
                                      KNOWN_HOST_OPS_HALF)
from tests.ops.sweep import COUNTED, OpResult, run_op

FULL = os.environ.get("SIMACCEL_OPINFO", "") == "full"
SAMPLES = int(os.environ.get("SIMACCEL_OPINFO_SAMPLES", "1"))

#: the fast subset: forward in float32
FORWARD = (
    "sort", "topk", "kthvalue", "searchsorted", "flip", "repeat", "unfold",
    "diagonal_scatter", "scatter_reduce.amax", "index_reduce.mean", "masked_scatter",
    "cummax", "logcumsumexp", "lgamma", "polygamma.polygamma_n_1", "erfinv",
    "special.bessel_j0", "special.chebyshev_polynomial_t", "nn.functional.conv1d",
    "nn.functional.conv_transpose2d", "nn.functional.conv3d", "nn.functional.max_pool3d",
    "nn.functional.adaptive_max_pool2d", "nn.functional.avg_pool3d",
    "nn.functional.grid_sample", "linalg.inv", "fft.rfft", "index_select", "igamma")
#: ... with backward
BACKWARD = ("nn.functional.conv2d", "nn.functional.max_pool2d", "sort",
            "scatter_reduce.sum", "cumsum", "nn.functional.layer_norm")
#: ... in bfloat16
HALF = ("add", "softmax", "median", "matmul", "nn.functional.gelu", "sum",
        "nn.functional.conv2d", "nn.functional.embedding_bag")

pytestmark = pytest.mark.opinfo_full if FULL else []


def _op_db() -> dict[str, object]:
    from torch.testing._internal.common_methods_invocations import op_db  # needs expecttest
    from tests.ops.sweep import op_name
    return {op_name(op): op for op in op_db}


def _cases() -> list[tuple[str, str]]:
    """(mode, op name) of every test of this run."""
    if not FULL:
        return ([("float32", n) for n in FORWARD] + [("float32+backward", n) for n in BACKWARD]
                + [("bfloat16", n) for n in HALF])
    names = sorted(_op_db())
    return [(mode, n) for mode in ("float32", "float32+backward", "bfloat16") for n in names]


@pytest.fixture(scope="module")
def op_db() -> dict[str, object]:
    return _op_db()


def _run(op_db: dict[str, object], mode: str, name: str) -> OpResult:
    dtype = torch.bfloat16 if mode == "bfloat16" else torch.float32
    return run_op(op_db[name], dtype, backward=mode.endswith("backward"), limit=SAMPLES)


@pytest.mark.parametrize("mode,name", _cases(), ids=[f"{m}-{n}" for m, n in _cases()])
def test_opinfo(op_db: dict[str, object], mode: str, name: str,
                record_property: pytest.RecordProperty) -> None:
    result = _run(op_db, mode, name)
    record_property("opinfo_result", (mode, asdict(result)))
    if result.status not in COUNTED:
        pytest.skip(f"{result.status}: {result.detail[:120]}")  # says nothing of simaccel
    assert result.status not in ("error", "mismatch"), f"{name}: {result.detail}"
    known = {**KNOWN_HOST_OPS, **(KNOWN_HOST_OPS_HALF if mode == "bfloat16" else {}),
             **(KNOWN_HOST_OPS_BACKWARD if mode.endswith("backward") else {})}
    if result.status == "host":
        assert name in known, (f"{name} ({mode}) runs on the host and is not a known host op: "
                               f"{result.fallbacks}")
    elif name in known:
        record_property("opinfo_improved", f"{name} ({mode})")

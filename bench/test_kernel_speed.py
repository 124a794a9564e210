"""Kernel throughput: every backend on the same workloads in one run (seconds per call).

Targets (issue 2): 8-op pointwise chain on 4M float32 at least 2x faster than eager;
row reductions on 4096x1024 at least 1.5x faster than eager.
"""
from __future__ import annotations

import pytest
import torch

from bench.workloads import QUICK
from simaccel.bench import BACKENDS
from simaccel.bench.scenarios import prepare_kernel
from simaccel.bench.workloads import KERNEL_WORKLOADS


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("workload", list(KERNEL_WORKLOADS))
def test_kernel_throughput(benchmark, workload: str, backend: str) -> None:
    compiled, args = prepare_kernel(workload, backend, quick=QUICK)
    benchmark.group = f"kernel_{workload}[{KERNEL_WORKLOADS[workload].sizes[int(QUICK)]}]"
    benchmark.extra_info["backend"] = backend
    with torch.no_grad():
        benchmark(compiled, *args)

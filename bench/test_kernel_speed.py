"""Kernel throughput, each backend on the same workloads in one run.

Targets (issue 2): 8-op pointwise chain on 4M float32 at least 2x faster than eager;
row reductions on 4096x1024 at least 1.5x faster than eager.
"""
from __future__ import annotations

import pytest
import torch

from bench.workloads import BACKENDS, KERNEL_WORKLOADS, compile_for


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("workload", sorted(KERNEL_WORKLOADS))
def test_kernel_throughput(benchmark, workload, backend):
    fn, make_inputs = KERNEL_WORKLOADS[workload]
    torch._dynamo.reset()
    args = make_inputs()
    compiled = compile_for(fn, backend, dynamic=False)
    expected = fn(*args)
    torch.testing.assert_close(compiled(*args), expected, rtol=1e-4, atol=1e-4)
    benchmark.group = workload
    benchmark.extra_info["backend"] = backend
    benchmark(compiled, *args)

"""The benchmark workloads live in :mod:`simaccel.bench.workloads` (``simaccel bench``
runs them too); re-exported here for the pytest-benchmark suites."""
from __future__ import annotations

import os

from simaccel.bench.workloads import (  # noqa: F401
    KERNEL_WORKLOADS, SCALAR_SCENARIOS, chain8, mlp, mlp3, row_reductions, tiny,
)
from simaccel.bench import BACKENDS  # noqa: F401
from simaccel.bench.measure import compile_for  # noqa: F401

#: ``SIMACCEL_BENCH_QUICK=1``: tiny sizes, compile-time runs for simaccel only (smoke test).
QUICK = os.environ.get("SIMACCEL_BENCH_QUICK", "") not in ("", "0")

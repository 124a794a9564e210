"""Benchmark scenarios shared by ``simaccel bench`` and the pytest-benchmark suites.

* :mod:`simaccel.bench.workloads`: the programs (scalar scenarios, kernels, MLP);
* :mod:`simaccel.bench.measure`: compiling per backend, timing, Dynamo's limits;
* :mod:`simaccel.bench.scenarios`: one measurement = one :class:`Record`;
* :mod:`simaccel.bench.runner`: ``run_bench``, all scenarios x backends in one run;
* :mod:`simaccel.bench.report`: ratios to same-run baselines, table, targets, JSON;
* :mod:`simaccel.bench.plot`: the PNG (matplotlib, optional);
* :mod:`simaccel.bench.command`: ``simaccel bench``.

Importing this package does not import torch (the CLI validates arguments first).
"""
from __future__ import annotations

#: backends compared side by side in one run; "eager" is plain PyTorch without Dynamo,
#: "dynamo_eager" is Dynamo with its own ``eager`` backend.
BACKENDS = ("eager", "dynamo_eager", "aot_eager", "inductor", "simaccel")

__all__ = ["BACKENDS"]

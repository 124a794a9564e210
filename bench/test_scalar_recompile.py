"""Recompile latency: a call whose Python scalar changed, every backend in one run.

Each round hands the scenario a value never used before; ``extra_info`` holds the graphs
Dynamo compiled during the timed rounds (``recompiles``, from
``counters["stats"]["unique_graphs"]``) and the median of steady calls with an unchanged
value (``steady_median_s``). Dynamo's recompile limit is raised for the test so that
backends which recompile keep recompiling instead of falling back to eager.
Target: simaccel's changed call <= 1.1x its steady call.
"""
from __future__ import annotations

import pytest

from simaccel.bench import BACKENDS, measure
from simaccel.bench.scenarios import DYNAMIC_MODES, prepare_scalar, scalar_id
from simaccel.bench.workloads import SCALAR_SCENARIOS

#: changed-scalar rounds per backend (each one is a full recompile for some backends).
ROUNDS = {"inductor": 3}
DEFAULT_ROUNDS = 30


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dynamic", DYNAMIC_MODES, ids=lambda d: f"dynamic={d}")
@pytest.mark.parametrize("scenario", list(SCALAR_SCENARIOS))
def test_changed_scalar_call(benchmark, scenario: str, dynamic: bool | None,
                             backend: str) -> None:
    benchmark.group = f"scalar_{scalar_id(scenario, dynamic)}"
    benchmark.extra_info["backend"] = backend
    steady: list[float] = []

    def steady_call_then_changed_args() -> tuple[tuple, dict]:
        # a timed steady call (after an untimed one: the value really repeats) before
        # every round, so both see the same caches and machine load
        run.compiled(*run.steady_args())
        steady.append(measure.time_call(run.compiled, run.steady_args()))
        return run.changed_args(), {}

    with measure.recompile_limits():
        run = prepare_scalar(SCALAR_SCENARIOS[scenario], backend, dynamic)
        benchmark.pedantic(run.compiled, setup=steady_call_then_changed_args,
                           rounds=ROUNDS.get(backend, DEFAULT_ROUNDS), iterations=1)
        benchmark.extra_info["recompiles"] = measure.graphs_compiled() - run.graphs_after_first
    benchmark.extra_info["steady_median_s"] = measure.median(steady)
    benchmark.extra_info["first_call_s"] = run.first_call_s

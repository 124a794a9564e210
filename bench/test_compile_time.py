"""Cold and warm compile: the first call of a 3-layer MLP in a new process.

cold: empty ``SIMACCEL_CACHE_DIR``/``TORCHINDUCTOR_CACHE_DIR``; warm: a second process
reusing the cold run's folders. The figure is the first call inside the child
(``extra_info["seconds"]``); the benchmark's own time also counts interpreter start-up.
Targets: simaccel cold <= 1/5 of inductor cold; simaccel warm <= 1/3 of its cold.
"""
from __future__ import annotations

import pytest

from bench.workloads import QUICK
from simaccel.bench import BACKENDS
from simaccel.bench.coldstart import first_call_in_new_process

#: cache folder of each backend's cold run, reused by its warm run.
_COLD_CACHES: dict[str, str] = {}


def _skip_in_quick_mode(backend: str) -> None:
    if QUICK and backend != "simaccel":
        pytest.skip("SIMACCEL_BENCH_QUICK: compile time is measured for simaccel only")


def _measure(benchmark, backend: str, cache_root: str) -> None:
    result: dict = {}
    benchmark.pedantic(lambda: result.update(first_call_in_new_process(backend, cache_root)),
                       rounds=1, iterations=1)
    benchmark.extra_info.update(backend=backend, seconds=result["first_call_s"],
                                graphs=result["graphs"], process_s=result["process_s"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_cold_compile_mlp3(benchmark, backend: str, tmp_path_factory) -> None:
    _skip_in_quick_mode(backend)
    benchmark.group = "compile_cold_mlp3"
    root = str(tmp_path_factory.mktemp(f"cold-{backend}"))
    _measure(benchmark, backend, root)
    _COLD_CACHES[backend] = root


@pytest.mark.parametrize("backend", BACKENDS)
def test_warm_compile_mlp3(benchmark, backend: str, tmp_path_factory) -> None:
    _skip_in_quick_mode(backend)
    benchmark.group = "compile_warm_mlp3"
    root = _COLD_CACHES.get(backend)
    if root is None:  # run alone (-k warm): fill the caches first, untimed
        root = str(tmp_path_factory.mktemp(f"cold-{backend}"))
        first_call_in_new_process(backend, root)
    _measure(benchmark, backend, root)


@pytest.mark.parametrize("lift", ["off", "auto"])
def test_first_compile_with_lifting(benchmark, lift: str, tmp_path_factory) -> None:
    """First compile of an MLP reading three Python scalars, lift="auto" (one re-trace
    inside the compile) against lift="off". Target: at most 1.5x."""
    benchmark.group = "compile_cold_lift"
    root = str(tmp_path_factory.mktemp(f"lift-{lift}"))
    result: dict = {}
    benchmark.pedantic(lambda: result.update(
        first_call_in_new_process("simaccel", root, lift=lift)), rounds=1, iterations=1)
    benchmark.extra_info.update(backend=f"simaccel[lift={lift}]", seconds=result["first_call_s"],
                                graphs=result["graphs"], process_s=result["process_s"])

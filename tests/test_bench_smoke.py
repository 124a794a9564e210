"""The benchmark suites never rot: every benchmark in ``bench/`` runs once, at tiny sizes
(``SIMACCEL_BENCH_QUICK=1``) and without inductor (its compiles take 8-16 s each here),
plus unit tests of the ``simaccel.bench`` runner pieces that need no compile."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from simaccel.bench.report import Target, fmt_seconds, targets, to_json
from simaccel.bench.runner import BenchResult, Task, select
from simaccel.bench.scenarios import Record

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_benchmarks_run_once_at_quick_sizes(tmp_path):
    env = {**os.environ, "SIMACCEL_BENCH_QUICK": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "bench/", "--benchmark-disable", "-k", "not inductor",
         "-q", "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def _task(key: str, backend: str = "simaccel") -> Task:
    group, scenario = key.split("/", 1)
    return Task(group, scenario, backend, lambda: Record(group, scenario, backend))


def test_select_keeps_the_cold_run_a_warm_compile_needs():
    tasks = [_task("compile/cold_mlp3"), _task("compile/warm_mlp3"), _task("steady/tiny")]
    assert [t.key for t in select(tasks, ["warm"])] == ["compile/cold_mlp3", "compile/warm_mlp3"]
    assert [t.key for t in select(tasks, None)] == [t.key for t in tasks]
    assert select(tasks, ["nothing"]) == []


def _result() -> BenchResult:
    recs = [
        Record("compile", "cold_mlp3", "inductor", 10.0, 1),
        Record("compile", "cold_mlp3", "simaccel", 1.0, 1),
        Record("compile", "warm_mlp3", "simaccel", 0.25, 1),
        Record("compile", "lift_off_scaled_mlp", "simaccel", 1.0, 1),
        Record("compile", "lift_auto_scaled_mlp", "simaccel", 1.2, 1),
        Record("scalar", "float_arg[dynamic=False]", "simaccel", 1.05e-4, 20,
               {"recompiles": 0, "steady_median_s": 1e-4, "changed_vs_steady": 1.05}),
        Record("steady", "tiny_x*2+1_16", "dynamo_eager", 2e-5, 30),
        Record("steady", "tiny_x*2+1_16", "simaccel", 4e-5, 30),
        Record("guard", "3_scalars[added_guard]", "simaccel", skipped="no Guard"),
        Record("guard", "3_scalars[default]", "simaccel", 3e-5, 30, {"guard_check_s": 1.1e-6}),
        Record("guard", "3_scalars[lift_off]", "simaccel", 3e-5, 30, {"guard_check_s": 1e-6}),
        Record("kernel", "chain8[4M f32]", "eager", 16e-3, 10),
        Record("kernel", "chain8[4M f32]", "simaccel", 7e-3, 10,
               {"quick_sizes": False, "kernel_s_per_call": 5e-3}),
        Record("kernel", "row_reductions[64x128]", "eager", 1e-5, 10),
        Record("kernel", "row_reductions[64x128]", "simaccel", 1e-5, 10, {"quick_sizes": True}),
    ]
    return BenchResult(recs, ["dynamo_eager", "inductor", "simaccel"], {"quick": True})


def test_targets_are_computed_from_same_run_baselines():
    found = {t.name: t for t in targets(_result())}
    assert found["simaccel cold compile / inductor cold compile"].value == 0.1
    assert found["simaccel warm compile / simaccel cold compile"].value == 0.25
    assert found["simaccel changed-scalar call / steady call"].met is True
    assert found["simaccel tiny steady call / dynamo_eager"].value == 2.0
    assert found["simaccel tiny steady call / dynamo_eager"].met is False
    assert Target("x", None, 1.0).met is None
    retrace = found["simaccel first compile lift='auto' / lift='off'"]
    assert abs(retrace.value - 1.2) < 1e-9 and retrace.met is True
    guard = found["simaccel guard check lifted / lift='off'"]
    assert abs(guard.value - 1.1) < 1e-9 and guard.met is False
    assert found["simaccel chain8 / eager (full size)"].value == 7e-3 / 16e-3
    assert found["simaccel chain8 / eager (full size)"].met is True
    # quick sizes measure per-call overhead, not kernels: no verdict from them
    assert found["simaccel row_reductions / eager (full size)"].met is None


def test_json_holds_recompiles_medians_ratios_and_skips():
    data = to_json(_result())
    entry = data["results"]["simaccel"]["scalar/float_arg[dynamic=False]"]
    assert entry["recompiles"] == 0 and entry["median_s"] == 1.05e-4
    assert data["results"]["simaccel"]["compile/warm_mlp3"]["ratio"] == 0.25
    assert data["skipped"] == [{"backend": "simaccel", "scenario": "guard/3_scalars[added_guard]",
                                "reason": "no Guard"}]


def test_fmt_seconds_units():
    assert [fmt_seconds(s) for s in (None, 2e-6, 2e-3, 2.0)] == ["-", "2.0 us", "2.00 ms",
                                                                 "2.00 s"]

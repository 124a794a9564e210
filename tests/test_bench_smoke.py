"""The benchmark suites never rot: every benchmark in ``bench/`` runs once, at tiny sizes
(``SIMACCEL_BENCH_QUICK=1``) and without inductor (its compiles take 8-16 s each here),
plus unit tests of the ``simaccel.bench`` runner pieces that need no compile, and the
``optim`` and bf16 kernel scenarios of ``simaccel bench`` run in-process at tiny sizes."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

from simaccel.bench import measure, optim, scenarios
from simaccel.bench.configmodel import OPERAND_SETTINGS, config_model
from simaccel.bench.report import (Target, _extra_cells, fmt_seconds, print_table, targets,
                                   to_json)
from simaccel.bench.runner import BenchResult, Task, build_tasks, run_bench, run_tasks, select
from simaccel.bench.scenarios import BenchConfig, Record

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_benchmarks_run_once_at_quick_sizes(tmp_path):
    # compile workers as a user has them (the test session's are off): the first calls
    # in new processes then start in tier 0 (the in-process benchmarks turn it off)
    env = {**os.environ, "SIMACCEL_BENCH_QUICK": "1", "SIMACCEL_COMPILE_WORKERS": "2",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    proc = subprocess.run(
        # the bf16 / sort / grouped-conv kernel workloads are left to the runner's smoke
        # test below (one each would add ~27 s of numba compiles here); of the compile-time
        # benchmarks (fresh processes on cold caches, ~8 s each) the lifting pair runs its
        # "auto" half and the cold/warm pair its cold half: the other half of each runs the
        # same code with another setting; every benchmark runs for eager and simaccel only
        # (Dynamo's eager and aot_eager backends run the same measuring code)
        [sys.executable, "-m", "pytest", "bench/", "--benchmark-disable", "-k",
         "not inductor and not bf16 and not sort_last and not topk16 and not grouped_conv "
         "and not test_first_compile_with_lifting[off] and not test_warm_compile_mlp3 "
         "and not (test_cold_compile_mlp3 and not simaccel) and not aot_eager "
         "and not dynamo_eager",
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


def test_quick_runs_the_config_model_compiles_only_when_selected():
    tasks = build_tasks(["simaccel"], BenchConfig.make(quick=True), "/nonexistent")
    key = "compile/lift_off+auto_config_model"
    assert key not in {t.key for t in select(tasks, None)}
    assert [t.key for t in select(tasks, ["config_model"])] == [key]
    full = build_tasks(["simaccel"], BenchConfig.make(quick=False), "/nonexistent")
    assert key in {t.key for t in select(full, None)}


def test_a_task_may_return_several_records_and_a_failing_one_is_skipped():
    pair = Task("compile", "lift_off+auto_x", "simaccel",
                lambda: [Record("compile", "lift_off_x", "simaccel", 1.0, 1),
                         Record("compile", "lift_auto_x", "simaccel", 1.1, 1)])
    broken = Task("optim", "adamw_step[1]", "simaccel", lambda: 1 / 0)
    recs = run_tasks([pair, broken], progress=None)
    assert [r.key for r in recs] == ["compile/lift_off_x", "compile/lift_auto_x",
                                     "optim/adamw_step[1]"]
    assert recs[-1].skipped.startswith("error: ZeroDivisionError")


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
        Record("kernel", "grouped_conv[8x64x56x56 g8 3x3]", "eager", 2e-3, 10),
        Record("kernel", "grouped_conv[8x64x56x56 g8 3x3]", "simaccel", 4e-3, 10,
               {"quick_sizes": False}),
        Record("compile", "lift_off_config_model", "simaccel", 2.0, 3),
        Record("compile", "lift_auto_config_model", "simaccel", 2.2, 3, {"lifted": 2}),
        Record("optim", "adamw_step[10x64x64]", "eager", 1e-3, 20),
        Record("optim", "adamw_step[10x64x64]", "simaccel", 8e-4, 20,
               {"over_eager": 0.9, "graphs": 1, "recompiles": 0, "recompiles_timed": 0}),
        Record("optim", "sgd_momentum_step[10x64x64]", "simaccel", skipped="error: boom"),
    ]
    return BenchResult(recs, ["dynamo_eager", "inductor", "simaccel"], {"quick": True})


def test_targets_are_computed_from_same_run_baselines():
    found = {t.name: t for t in targets(_result())}
    assert found["simaccel cold compile / inductor cold compile"].value == 0.1
    assert found["simaccel warm compile / simaccel cold compile"].value == 0.25
    assert found["simaccel changed-scalar call / steady call"].met is True
    assert found["simaccel tiny steady call / dynamo_eager"].value == 2.0
    assert found["simaccel tiny steady call / dynamo_eager"].met is False
    # timed in the same rounds as Dynamo eager: that ratio, not the two records'
    same = _result()
    tiny = same.get("steady/tiny_x*2+1_16", "simaccel")
    tiny.extra["over_baseline"] = 1.1
    found_same = {t.name: t for t in targets(same)}["simaccel tiny steady call / dynamo_eager"]
    assert found_same.value == 1.1 and found_same.met is True and "same rounds" in found_same.note
    assert Target("x", None, 1.0).met is None
    retrace = found["simaccel first compile lift='auto' / lift='off'"]
    assert abs(retrace.value - 1.2) < 1e-9 and retrace.met is True
    guard = found["simaccel guard check lifted / lift='off'"]
    assert abs(guard.value - 1.1) < 1e-9 and guard.met is False
    # the lifted record's same-round timings of both frames win over the two records'
    lifted = same.get("guard/3_scalars[default]", "simaccel")
    lifted.extra.update(guard_check_same_rounds_s=0.9e-6, guard_check_off_same_rounds_s=1e-6,
                        call_same_rounds_s=3.3e-5, call_off_same_rounds_s=3e-5)
    found_same = {t.name: t for t in targets(same)}
    assert abs(found_same["simaccel guard check lifted / lift='off'"].value - 0.9) < 1e-9
    assert abs(found_same["simaccel lifted frame call / lift='off'"].value - 1.1) < 1e-9
    assert found["simaccel chain8 / eager (full size)"].value == 7e-3 / 16e-3
    assert found["simaccel chain8 / eager (full size)"].met is True
    # quick sizes measure per-call overhead, not kernels: no verdict from them
    assert found["simaccel row_reductions / eager (full size)"].met is None
    assert found["simaccel grouped_conv / eager (full size)"].value == 2.0
    assert found["simaccel grouped_conv / eager (full size)"].met is False
    config = found["simaccel config model first compile auto / off"]
    assert abs(config.value - 1.1) < 1e-9 and config.bound == 1.3 and config.met is True
    adamw = found["simaccel adamw step / plain eager step"]
    assert adamw.value == 0.9 and adamw.met is True and "graphs 1" in adamw.note
    assert found["simaccel sgd_momentum step / plain eager step"].met is None  # skipped


def test_kernel_targets_divide_each_backends_same_round_ratio_over_eager():
    """Backends run in separate processes: each compiled backend's kernel record carries
    its time over eager's from the same rounds, and the targets use those."""
    result = _result()
    result.records += [
        Record("kernel", "gpt2[6 layers]", "eager", 9e-3, 10),  # a slow moment: ignored
        Record("kernel", "gpt2[6 layers]", "inductor", 4e-3, 10,
               {"quick_sizes": False, "over_eager": 0.80}),
        Record("kernel", "gpt2[6 layers]", "simaccel", 4.5e-3, 10,
               {"quick_sizes": False, "over_eager": 0.78}),
        Record("kernel", "mlp[512]", "eager", 1e-3, 10),
        Record("kernel", "mlp[512]", "simaccel", 1.2e-3, 10,
               {"quick_sizes": False, "over_eager": 1.1}),
    ]
    found = {t.name: t for t in targets(result)}
    gpt2 = found["simaccel gpt2 / inductor (full size)"]
    assert abs(gpt2.value - 0.78 / 0.80) < 1e-9 and gpt2.met is True
    assert found["simaccel mlp / eager (full size)"].value == 1.1
    assert found["simaccel mlp / eager (full size)"].met is False
    assert found["simaccel chain8 / inductor (full size)"].met is None  # no inductor record


def test_a_kernel_target_against_a_backend_prefers_their_same_rounds_ratio():
    """simaccel's record timed beside the rival's calls carries ``over_<rival>``: the
    target reads that one ratio, not the two records' ratios over eager divided."""
    result = _result()
    result.records += [
        Record("kernel", "gpt2[6 layers]", "inductor", 4e-3, 10,
               {"quick_sizes": False, "over_eager": 0.75}),
        Record("kernel", "gpt2[6 layers]", "simaccel", 4.5e-3, 10,
               {"quick_sizes": False, "over_eager": 0.80, "over_inductor": 0.94,
                "inductor_same_rounds_s": 4.1e-3}),
    ]
    found = {t.name: t for t in targets(result)}
    gpt2 = found["simaccel gpt2 / inductor (full size)"]
    assert gpt2.value == 0.94 and gpt2.met is True and gpt2.note == "(same rounds)"


def test_simaccels_kernel_task_alternates_with_the_rival_kept_by_its_task(monkeypatch):
    """The rival's task keeps its compiled workload; simaccel's times both in alternating
    batches (the rival compiles again after Dynamo's reset) and lets it go."""
    from simaccel.bench import scenarios as sc
    from simaccel.bench.workloads import KernelWorkload

    def make(quick):
        return (lambda x: (x * 2 + 1).sin()), (torch.randn(256),)
    workload = KernelWorkload("tiny_pair", make, ("256", "256"))
    monkeypatch.setitem(sc.KERNEL_WORKLOADS, "tiny_pair", workload)
    monkeypatch.setitem(sc.KERNEL_RIVALS, "tiny_pair", "dynamo_eager")
    cfg = sc.BenchConfig(quick=False, batches=4)
    rival = sc.measure_kernel("tiny_pair", "dynamo_eager", cfg)
    assert "tiny_pair" in sc._KEPT_RIVALS and "over_dynamo_eager" not in rival.extra
    ours = sc.measure_kernel("tiny_pair", "simaccel", cfg)
    assert "tiny_pair" not in sc._KEPT_RIVALS
    x = ours.extra
    assert x["over_dynamo_eager"] > 0 and x["dynamo_eager_same_rounds_s"] > 0
    assert x["kernel_s_per_call"] > 0  # simaccel's kernels ran
    assert "/dynamo_eager same rounds" in _extra_cells(ours)


def test_batches_beside_a_baseline_alternate_and_time_both():
    order: list[str] = []
    ours, theirs = measure.time_batches_beside(lambda: order.append("a"),
                                               lambda: order.append("b"), (), 4, 2)
    assert len(ours) == len(theirs) == 4
    assert "".join(order) == "aabb" "bbaa" "aabb" "bbaa"


def test_warm_over_cold_compile_counts_until_kernels_run_compiled():
    """With tier 0 a cold first call runs before numba is done, so the kernel cache's
    saving shows in the time until every kernel is compiled (``compiled_s``)."""
    result = _result()
    result.get("compile/cold_mlp3", "simaccel").extra["compiled_s"] = 4.0
    result.get("compile/warm_mlp3", "simaccel").extra["compiled_s"] = 0.5
    target = {t.name: t for t in targets(result)}[
        "simaccel warm compile / simaccel cold compile"]
    assert target.value == 0.125 and target.met is True and "compiled" in target.note


def test_json_holds_recompiles_medians_ratios_and_skips():
    data = to_json(_result())
    entry = data["results"]["simaccel"]["scalar/float_arg[dynamic=False]"]
    assert entry["recompiles"] == 0 and entry["median_s"] == 1.05e-4
    assert data["results"]["simaccel"]["compile/warm_mlp3"]["ratio"] == 0.25
    assert data["skipped"] == [
        {"backend": "simaccel", "scenario": "guard/3_scalars[added_guard]", "reason": "no Guard"},
        {"backend": "simaccel", "scenario": "optim/sgd_momentum_step[10x64x64]",
         "reason": "error: boom"}]


def test_fmt_seconds_units():
    assert [fmt_seconds(s) for s in (None, 2e-6, 2e-3, 2.0)] == ["-", "2.0 us", "2.00 ms",
                                                                 "2.00 s"]


@pytest.fixture
def tiny_optim(monkeypatch):
    """Quick optimizer steps at a few seconds' size: 2 parameters of 4x4, 3 warm-up steps
    (the first compile and Dynamo's recompile on the first new lr), 2 rounds of 2."""
    monkeypatch.setattr(optim, "QUICK", optim.OptimSizes(params=2, side=4, warmup=3, rounds=2,
                                                         steps=2))


def test_optim_steps_record_graphs_and_ratios_per_backend(tiny_optim):
    backends = ["eager", "dynamo_eager", "simaccel"]
    result = run_bench(backends, quick=True, scenarios=["optim/sgd_momentum"], progress=None)
    assert [(r.key, r.backend) for r in result.records] == [
        ("optim/sgd_momentum_step[2x4x4]", b) for b in backends]
    for rec in result.records:
        assert rec.skipped is None and rec.samples == 2 and rec.median_s > 0, rec
        x = rec.extra
        assert x["min_s"] <= rec.median_s and x["eager_s"] > 0 and x["over_eager"] > 0
        assert x["steps"] == 3 + 2 * 2 and x["recompiles_timed"] >= 0
    graphs = {r.backend: r.extra["graphs"] for r in result.records}
    assert graphs["eager"] == 0 and graphs["simaccel"] == 1 and graphs["dynamo_eager"] >= 1
    assert result.records[-1].extra["recompiles"] == 0  # lr lifted: no recompile
    found = {t.name: t for t in targets(result)}
    assert found["simaccel sgd_momentum step / plain eager step"].value is not None
    assert found["simaccel adamw step / plain eager step"].met is None  # not selected
    data = to_json(result)["results"]["simaccel"]["optim/sgd_momentum_step[2x4x4]"]
    assert data["ratio_baseline"] == "eager" and data["ratio"] > 0 and data["graphs"] == 1


def test_training_step_records_its_ratio_to_eager(tiny_optim):
    """The whole training step (forward, backward, opt.step of an MLP, model and step
    compiled) against an eager copy trained in the same rounds."""
    result = run_bench(["eager", "simaccel"], quick=True, scenarios=["optim/mlp_train"],
                       progress=None)
    assert [r.backend for r in result.records] == ["eager", "simaccel"]
    for rec in result.records:
        assert rec.skipped is None and rec.samples == 2 and rec.median_s > 0, rec
        assert rec.extra["over_eager"] > 0 and rec.extra["steps"] == 3 + 2 * 2
    assert result.records[-1].extra["graphs"] >= 2  # the model's and the step's
    found = {t.name: t for t in targets(result)}
    assert found["simaccel mlp_train step / plain eager step"].value is not None
    for rec in result.records:  # where each step's time went, the eager copy's beside it
        for key, step_s in (("step_phases_s", rec.median_s),
                            ("eager_step_phases_s", rec.extra["eager_s"])):
            phases = rec.extra[key]
            assert list(phases) == ["forward", "backward", "step", "zero_grad"], phases
            assert all(s > 0 for s in phases.values())
            # the phases lie inside the timed step (two rounds: medians are means, and add)
            assert 0.5 * step_s < sum(phases.values()) <= step_s, (phases, step_s)
    cells = _extra_cells(result.records[-1])
    assert "phases over eager's: forward " in cells and ", zero_grad " in cells, cells


def test_bf16_kernel_records_compare_with_eager_in_bf16():
    result = run_bench(["eager", "simaccel"], quick=True, scenarios=["kernel/chain8_bf16"],
                       progress=None)
    assert [r.scenario for r in result.records] == ["chain8_bf16[64K bf16]"] * 2
    assert all(r.skipped is None and r.samples > 0 for r in result.records)
    data = to_json(result)["results"]["simaccel"]["kernel/chain8_bf16[64K bf16]"]
    assert data["ratio_baseline"] == "eager" and data["ratio"] > 0


def test_new_scenarios_are_in_the_task_list():
    cfg = BenchConfig.make(quick=True)
    keys = {t.key for t in build_tasks(["eager", "simaccel"], cfg, "/nonexistent")}
    assert {"optim/adamw_step[10x64x64]", "optim/sgd_momentum_step[10x64x64]",
            "compile/lift_off+auto_config_model", "compile/lift_off+auto_scaled_mlp",
            "kernel/layernorm_gelu_bf16[32x128 bf16]", "kernel/mlp_bf16[64-256-64 b8 bf16]",
            "kernel/sort_last[16x256]", "kernel/topk16[16x256 k16]",
            "kernel/grouped_conv[1x64x8x8 g8 3x3]"} <= keys


def test_config_model_compiles_alternate_off_and_auto_and_take_medians(monkeypatch):
    times = iter([3.0, 4.0, 1.0, 6.0, 2.0, 5.0])  # off, auto, off, auto, off, auto
    seen = []

    def fake_first_call(backend, root, lift=None, workload=None):
        seen.append((backend, root, lift, workload))
        s = next(times)
        return {"first_call_s": s, "process_s": s + 3, "graphs": 1,
                "lifted": 2 if lift == "auto" else 0}
    monkeypatch.setattr(scenarios, "first_call_in_new_process", fake_first_call)
    off, auto = scenarios.measure_lift_compiles("/tmp/x", scenarios.CONFIG_WORKLOAD, rounds=3)
    assert [s[2] for s in seen] == ["off", "auto"] * 3
    assert all(s[:1] + s[3:] == ("simaccel", "config_model") for s in seen)
    assert len({s[1] for s in seen}) == 6  # an empty cache folder each
    assert (off.key, off.samples, off.median_s, off.extra["min_s"]) == (
        "compile/lift_off_config_model", 3, 2.0, 1.0)
    assert (auto.key, auto.median_s, auto.extra["lifted"]) == (
        "compile/lift_auto_config_model", 5.0, 2)


def test_cold_model_compiles_alternate_backends_round_by_round_and_take_medians(monkeypatch):
    times = iter([1.0, 2.5, 2.0, 1.2, 1.1, 2.2])  # d, s | s, d | d, s
    seen = []

    def fake_first_call(backend, root, lift=None, workload=None):
        seen.append((backend, root, workload))
        s = next(times)
        return {"first_call_s": s, "process_s": s + 3, "graphs": 1,
                "phases_s": {"lower": s * 10}}
    monkeypatch.setattr(scenarios, "first_call_in_new_process", fake_first_call)
    eager, ours = scenarios.measure_cold_rounds(["dynamo_eager", "simaccel"], "/tmp/x", 3)
    assert [s[0] for s in seen] == ["dynamo_eager", "simaccel", "simaccel", "dynamo_eager",
                                    "dynamo_eager", "simaccel"]
    assert len({s[1] for s in seen}) == 6 and {s[2] for s in seen} == {"gpt2"}
    assert (eager.key, eager.samples, eager.median_s, eager.extra["runs_s"]) == (
        "compile/cold_gpt2", 3, 1.1, [1.0, 1.2, 1.1])
    assert (ours.backend, ours.median_s, ours.extra["min_s"]) == ("simaccel", 2.2, 2.0)
    assert ours.extra["phases_s"] == {"lower": 22.0}  # the median run's phases


def test_config_model_reads_twenty_settings_two_of_them_operands():
    model, (tokens,) = config_model()
    settings = vars(model.config)
    assert len(settings) == 20
    assert all(type(v) in (int, float, bool) for v in settings.values())
    assert set(OPERAND_SETTINGS) <= set(settings)
    out = model(tokens)
    assert out.shape == (*tokens.shape, model.config.vocab_size)


def test_table_prints_the_optim_group(capsys):
    import sys
    print_table(_result(), sys.stdout)
    out = capsys.readouterr().out
    assert "optim: compiled opt.step" in out and "graphs 1 (recompiles 0, 0 timed)" in out
    assert "/eager same rounds 0.90x" in out


def test_a_load_above_the_core_count_is_warned_about():
    from simaccel.bench.command import load_warning
    assert load_warning({"load_avg_1m_start": 1.5, "load_avg_1m_end": 1.9, "cpus": 2}) is None
    warning = load_warning({"load_avg_1m_start": 1.5, "load_avg_1m_end": 3.2, "cpus": 2})
    assert warning is not None and "3.2" in warning and "2 cores" in warning
    assert load_warning({"load_avg_1m_start": None, "load_avg_1m_end": None, "cpus": 2}) is None


def test_quick_leaves_the_slow_compiling_kernels_to_an_explicit_selection():
    quick = {t.key: t.opt_in for t in build_tasks(["simaccel"], BenchConfig.make(quick=True),
                                                  "/nonexistent")}
    full = {t.key: t.opt_in for t in build_tasks(["simaccel"], BenchConfig.make(quick=False),
                                                 "/nonexistent")}
    assert quick["kernel/sort_last[16x256]"] and quick["kernel/topk16[16x256 k16]"]
    with_baselines = build_tasks(["eager", "dynamo_eager"], BenchConfig.make(quick=True),
                                 "/nonexistent")
    opt_in = {(t.key, t.backend): t.opt_in for t in with_baselines}
    # quick kernel sizes give no verdict: plain eager is their baseline, Dynamo eager's
    # rows only when named
    assert opt_in[("kernel/chain8[64K f32]", "dynamo_eager")]
    assert not opt_in[("kernel/chain8[64K f32]", "eager")]
    # so are its optimizer and training steps (each compiles graphs of its own)
    assert opt_in[("optim/adamw_step[10x64x64]", "dynamo_eager")]
    assert not opt_in[("optim/adamw_step[10x64x64]", "eager")]
    assert all(opt for (key, backend), opt in opt_in.items()
               if key.startswith("optim/") and backend == "dynamo_eager")
    assert not quick["kernel/chain8[64K f32]"] and not quick["kernel/gpt2[1 layer, 2x16 tokens]"]
    assert not full["kernel/sort_last[1024x4096]"] and not full["kernel/topk16[1024x4096 k16]"]


def test_timed_child_processes_find_simaccels_bytecode_compiled():
    """An installed wheel comes byte-compiled, as torch's modules do: the children whose
    first call is timed must not compile simaccel's sources (PYTHONDONTWRITEBYTECODE is
    set in some environments, this one included)."""
    import importlib.util

    import simaccel.backend
    from simaccel.bench.coldstart import compile_package_bytecode

    compile_package_bytecode()
    for module in (simaccel.backend, scenarios):
        assert pathlib.Path(importlib.util.cache_from_source(module.__file__)).exists()


def test_first_call_child_times_the_collections_inside_the_call():
    """The child starts the timed call from a collected heap and reports the seconds of
    any collection inside it (``gc_s``), so a collection that lands there is visible."""
    import gc

    from simaccel.bench.coldstart import GcTimer

    timer = GcTimer()
    gc.collect()
    spent = timer.stop()
    assert spent > 0
    assert timer._on_gc not in gc.callbacks  # stopped: later collections are not counted

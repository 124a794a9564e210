"""Ratios against same-run baselines, the text table, the targets, JSON and the plot."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, TextIO

from simaccel.bench.runner import GROUPS, BenchResult
from simaccel.bench.scenarios import (CONFIG_WORKLOAD, DEPTHS, KERNEL_RIVALS, LIFT_WORKLOAD,
                                      MODEL_WORKLOAD, Record)

GROUP_TITLES = {
    "steady": "steady per-call time, tiny graph (baseline: Dynamo eager backend)",
    "scalar": "call with a changed scalar (median; baseline: plain eager; "
              "'/steady' = same backend with the scalar unchanged)",
    "guard": "steady call with 3 scalar args; guard check alone (baseline: Dynamo eager)",
    "kernel": "kernel throughput, seconds per call (baseline: plain eager)",
    "optim": "compiled opt.step, LambdaLR changing lr every step (train_step: forward, "
             "backward and opt.step of an MLP, model and step compiled): median seconds per "
             "step over rounds (baseline: plain eager; '/eager same rounds': an eager copy "
             "stepped in the same rounds), Dynamo graphs over all steps",
    "shape": "changing sizes: graphs and call time (baseline: Dynamo eager; dynamic vs "
             "static and new-size calls: simaccel against itself)",
    "ddp": "DDP training step on 2 gloo ranks, 5 gradient buckets: the slower rank's "
           "median seconds per step (baseline: plain eager DDP); collective = gradient "
           "bytes DMA'd off the device per step, hidden = simulated share under compute",
    "compile": "first call in a new process: cold = empty caches, warm = caches kept "
               "(baseline: cold -> inductor cold, warm -> same backend cold; lift_auto -> "
               "lift_off: simaccel with and without the lifting re-trace, empty caches; "
               "config_model: 20 config settings, 2 of them operands)",
}


def fmt_seconds(seconds: float | None) -> str:
    """``seconds`` with a readable unit (us, ms, s)."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def baseline_of(rec: Record) -> tuple[str, str, str] | None:
    """``(key, backend, label)`` of the record ``rec`` is compared with, or ``None``."""
    if rec.group in ("scalar", "kernel", "optim", "ddp"):
        return rec.key, "eager", "eager"
    if rec.group == "steady":
        return rec.key, "dynamo_eager", "dynamo_eager"
    if rec.group == "shape" and rec.scenario.startswith(("batch_sweep", "kv_")):
        return rec.key, "dynamo_eager", "dynamo_eager"
    if rec.group == "guard":
        return "guard/3_scalars[default]", "dynamo_eager", "dynamo_eager"
    if rec.group == "compile" and rec.scenario.startswith("lift_"):
        return rec.key.replace("lift_auto_", "lift_off_"), rec.backend, "lift='off'"
    if rec.group == "compile" and rec.scenario.startswith("cold_"):
        return rec.key, "inductor", "inductor cold"
    if rec.group == "compile":
        return rec.key.replace("warm_", "cold_"), rec.backend, "own cold"
    return None


def ratio(result: BenchResult, rec: Record) -> tuple[float | None, str]:
    """``rec``'s median over its baseline's median in the same run, and the label."""
    base = baseline_of(rec)
    if base is None or rec.median_s is None:
        return None, ""
    other = result.get(base[0], base[1])
    if other is None or not other.median_s:
        return None, base[2]
    return rec.median_s / other.median_s, base[2]


def _extra_cells(rec: Record) -> str:
    x = rec.extra
    if rec.group == "optim":
        return _optim_cells(rec)
    if rec.group == "ddp":
        return _ddp_cells(rec)
    cells = []
    if "recompiles" in x:
        cells.append(f"recompiles {x['recompiles']}/{rec.samples}")
    if x.get("steady_median_s") is not None:
        cells.append(f"steady {fmt_seconds(x['steady_median_s'])}")
    if x.get("changed_vs_steady") is not None:
        cells.append(f"/steady {x['changed_vs_steady']:.2f}x")
    if x.get("guard_check_s") is not None:
        cells.append(f"guard check {fmt_seconds(x['guard_check_s'])}")
    if x.get("over_baseline") is not None:
        cells.append(f"/dynamo_eager same rounds {x['over_baseline']:.2f}x")
    if x.get("kernel_s_per_call") is not None:
        cells.append(f"kernels {fmt_seconds(x['kernel_s_per_call'])}/call")
    if x.get("over_eager") is not None:
        cells.append(f"/eager same rounds {x['over_eager']:.2f}x")
    for rival in set(KERNEL_RIVALS.values()):
        if x.get(f"over_{rival}") is not None:
            cells.append(f"/{rival} same rounds {x[f'over_{rival}']:.2f}x")
    if x.get("graphs") is not None and rec.group == "shape":
        cells.append(f"graphs {x['graphs']}")
    for key, label in (("dynamic_over_static", "/static"), ("new_over_steady", "/steady")):
        if x.get(key) is not None:
            cells.append(f"{label} {x[key]:.2f}x")
    if x.get("process_s") is not None:
        cells.append(f"process {fmt_seconds(x['process_s'])}")
    if x.get("lifted") is not None:
        cells.append(f"lifted {x['lifted']}, graphs {x.get('graphs')}")
    if x.get("phases_s"):
        cells.append("phases: " + ", ".join(f"{name} {fmt_seconds(s)}"
                                            for name, s in x["phases_s"].items()))
    return ", ".join(cells)


def _optim_cells(rec: Record) -> str:
    """Graphs and recompiles over all steps, min, and the same-rounds eager ratio."""
    x = rec.extra
    cells = []
    if x.get("graphs") is not None:
        cells.append(f"graphs {x['graphs']} (recompiles {x.get('recompiles')}, "
                     f"{x.get('recompiles_timed')} timed)")
    if x.get("min_s") is not None:
        cells.append(f"min {fmt_seconds(x['min_s'])}")
    if x.get("over_eager") is not None:
        cells.append(f"/eager same rounds {x['over_eager']:.2f}x")
    if x.get("hit_recompile_limit"):
        cells.append("hit the recompile limit")
    ours, eager = x.get("step_phases_s"), x.get("eager_step_phases_s")
    if ours and eager:
        cells.append("phases over eager's: " + ", ".join(
            f"{name} {'+' if ours[name] >= eager[name] else '-'}"
            f"{fmt_seconds(abs(ours[name] - eager[name]))}" for name in ours if name in eager))
    return ", ".join(cells)


def _ddp_cells(rec: Record) -> str:
    x = rec.extra
    cells = ["ranks " + "/".join(fmt_seconds(m) for m in x.get("rank_medians_s", []))]
    if x.get("graphs") is not None:
        cells.append(f"graphs {x['graphs']}")
    if x.get("collective_bytes_per_step"):
        cells.append(f"collective {x['collective_bytes_per_step'] / 1e6:.2f} MB/step, "
                     f"hidden {100 * (x.get('hidden_fraction') or 0):.1f}%")
    return ", ".join(cells)


def _row(result: BenchResult, rec: Record) -> str:
    if rec.skipped:
        return f"  {rec.scenario:<34} {rec.backend:<12} skipped: {rec.skipped}"
    r, label = ratio(result, rec)
    ratio_cell = f"{r:.2f}x {label}" if r is not None else ""
    return (f"  {rec.scenario:<34} {rec.backend:<12} {fmt_seconds(rec.median_s):>10} "
            f"{ratio_cell:<22} {_extra_cells(rec)}")


def print_table(result: BenchResult, out: TextIO) -> None:
    """All records, grouped, each with its ratio to the same-run baseline."""
    for group in GROUPS:
        recs = [r for r in result.records if r.group == group]
        if not recs:
            continue
        print(f"\n{group}: {GROUP_TITLES[group]}", file=out)
        for rec in recs:
            print(_row(result, rec), file=out)
    print("\ntargets:", file=out)
    for t in targets(result):
        print("  " + t.line(), file=out)


@dataclass
class Target:
    """One figure the issue sets a bound on; ``value`` is ``None`` if not measured."""

    name: str
    value: float | None
    bound: float
    note: str = ""

    @property
    def met(self) -> bool | None:
        return None if self.value is None else self.value <= self.bound

    def line(self) -> str:
        state = {True: "met", False: "MISSED", None: "not measured"}[self.met]
        value = "-" if self.value is None else f"{self.value:.3f}"
        return f"{self.name:<52} {value:>8} (target <= {self.bound:.3g}) {state}  {self.note}"


def _median_ratio(result: BenchResult, key: str, num: str, den: str,
                  den_key: str | None = None) -> float | None:
    a, b = result.get(key, num), result.get(den_key or key, den)
    return a.median_s / b.median_s if a and b and a.median_s and b.median_s else None


def _tiny_target(result: BenchResult) -> Target:
    """simaccel's tiny steady call over Dynamo eager's, timed in the same rounds when
    the simaccel record has them (``extra["over_baseline"]``), else the two records'
    medians."""
    rec = result.get("steady/tiny_x*2+1_16", "simaccel")
    same = rec.extra.get("over_baseline") if rec else None
    if same is not None:
        return Target("simaccel tiny steady call / dynamo_eager", same, 1.2, "(same rounds)")
    return Target("simaccel tiny steady call / dynamo_eager",
                  _median_ratio(result, "steady/tiny_x*2+1_16", "simaccel", "dynamo_eager"),
                  1.2, "(separate runs)")


def _scalar_summary(result: BenchResult) -> tuple[float | None, str]:
    """Median over scalar scenarios of simaccel changed/steady; the note shows the worst
    and the changed-call medians of inductor and aot_eager next to simaccel's."""
    recs = [r for r in result.records if r.group == "scalar" and r.backend == "simaccel"
            and not r.skipped and r.extra.get("changed_vs_steady")]
    if not recs:
        return None, ""
    ratios = [r.extra["changed_vs_steady"] for r in recs]
    notes = [f"worst {max(ratios):.2f}x"]
    for backend in ("simaccel", "aot_eager", "inductor"):
        meds = [r.median_s for r in result.records if r.group == "scalar" and
                r.backend == backend and r.median_s is not None]
        if meds:
            notes.append(f"{backend} changed call {fmt_seconds(statistics.median(meds))}")
    return statistics.median(ratios), "; ".join(notes)


def _warm_vs_cold(warm: Record | None, cold: Record | None) -> float | None:
    """What the kernel cache saves: a warm process's time until every kernel runs
    compiled over a cold one's (``extra["compiled_s"]``: tier 0 lets the cold first call
    run before numba is done, so the first calls alone would not show the cache), or the
    first calls' ratio where a run did not record it."""
    if not (warm and cold and warm.median_s and cold.median_s):
        return None
    w, c = warm.extra.get("compiled_s"), cold.extra.get("compiled_s")
    return w / c if w and c else warm.median_s / cold.median_s


def targets(result: BenchResult) -> list[Target]:
    """The issues' targets, computed from this run only."""
    cold = "compile/cold_mlp3"
    warm_vs_cold = _warm_vs_cold(result.get("compile/warm_mlp3", "simaccel"),
                                 result.get(cold, "simaccel"))
    scalar, note = _scalar_summary(result)
    return [
        Target("simaccel cold compile / inductor cold compile",
               _median_ratio(result, cold, "simaccel", "inductor"), 0.2),
        Target("simaccel warm compile / simaccel cold compile", warm_vs_cold, 1 / 3,
               "(until every kernel runs compiled: first call + background compiles)"),
        Target("simaccel changed-scalar call / steady call", scalar, 1.1,
               f"(median over scenarios; {note})"),
        _tiny_target(result),
        Target("simaccel first compile lift='auto' / lift='off'",
               _median_ratio(result, f"compile/lift_auto_{LIFT_WORKLOAD}", "simaccel",
                             "simaccel", den_key=f"compile/lift_off_{LIFT_WORKLOAD}"), 1.5,
               "(scaled MLP, empty caches: the re-trace inside the first compile)"),
        Target("simaccel config model first compile auto / off",
               _median_ratio(result, f"compile/lift_auto_{CONFIG_WORKLOAD}", "simaccel",
                             "simaccel", den_key=f"compile/lift_off_{CONFIG_WORKLOAD}"), 1.3,
               "(20 config settings, 2 lifted; new process, empty caches)"),
        Target("simaccel GPT-2 6-layer cold first call / inductor",
               _median_ratio(result, f"compile/cold_{MODEL_WORKLOAD}", "simaccel", "inductor"),
               0.3, "(forward, new process, empty caches)"),
        Target("simaccel GPT-2 6-layer cold first call / dynamo_eager",
               _median_ratio(result, f"compile/cold_{MODEL_WORKLOAD}", "simaccel",
                             "dynamo_eager"), 2.0),
        Target("simaccel GPT-2 6-layer first call auto / off",
               _median_ratio(result, f"compile/lift_auto_{MODEL_WORKLOAD}", "simaccel",
                             "simaccel", den_key=f"compile/lift_off_{MODEL_WORKLOAD}"), 1.2,
               "(config object with 16 settings; new process, empty caches)"),
        _depth_target(result),
        Target("simaccel GPT-2 Mega-Cache load into empty caches / warm first call",
               _median_ratio(result, f"compile/megacache_load_{MODEL_WORKLOAD}", "simaccel",
                             "simaccel", den_key=f"compile/megacache_warm_{MODEL_WORKLOAD}"),
               1.3, _megacache_note(result)),
        Target("simaccel lifted frame call / lift='off'",
               _same_rounds_ratio(result, "call") or
               _median_ratio(result, "guard/3_scalars[default]", "simaccel", "simaccel",
                             den_key="guard/3_scalars[lift_off]"), 1.15,
               "(3 scalars, dynamic=False: steady call, tiny graph; same rounds)"),
        Target("simaccel guard check lifted / lift='off'", _guard_check_ratio(result), 1.0,
               "(3 scalars, dynamic=False: type guards + NaN/slot checks vs value guards; "
               "same rounds)"),
        *_kernel_targets(result),
        *_optim_targets(result),
        *_shape_targets(result),
    ]


def _depth_target(result: BenchResult) -> Target:
    """Kernels compiled for the deepest decoder over the shallowest (identical layers
    share every kernel: target 1.0)."""
    counts = [result.get(f"compile/layers_{n}_{MODEL_WORKLOAD}", "simaccel") for n in DEPTHS]
    ratio = note = None
    if all(counts):
        first, last = (r.extra["kernels_compiled"] for r in (counts[0], counts[-1]))
        ratio = last / first if first else None
        note = f"({last} kernels at {DEPTHS[-1]} layers, {first} at {DEPTHS[0]}; empty caches)"
    return Target(f"simaccel kernels compiled, GPT-2 {DEPTHS[-1]} / {DEPTHS[0]} layers", ratio,
                  1.0, note or "")


def _megacache_note(result: BenchResult) -> str:
    loaded = result.get(f"compile/megacache_load_{MODEL_WORKLOAD}", "simaccel")
    if loaded is None:
        return ""
    return f"(kernels compiled after the load: {loaded.extra['kernels_compiled']}; target 0)"


#: the compiled optimizer steps bounded: (optimizer, largest simaccel/eager step time);
#: ``mlp_train``: a whole SGD-momentum training step (:mod:`simaccel.bench.train`)
OPTIM_TARGETS = (("adamw", 1.0), ("sgd_momentum", 1.0), ("mlp_train", 1.0))


def _optim_targets(result: BenchResult) -> list[Target]:
    """simaccel's compiled ``opt.step`` over plain eager's, both timed in the same rounds
    (``extra["over_eager"]``: the machine's load is the same for both)."""
    out = []
    for name, bound in OPTIM_TARGETS:
        rec = next((r for r in result.records if r.group == "optim" and not r.skipped
                    and r.backend == "simaccel" and r.scenario.startswith(name + "_step[")),
                   None)
        note = ""
        if rec is not None:
            note = (f"(same rounds; graphs {rec.extra['graphs']}"
                    f"{', quick sizes' if rec.extra.get('quick_sizes') else ''})")
        out.append(Target(f"simaccel {name} step / plain eager step",
                          rec.extra.get("over_eager") if rec else None, bound, note))
    return out


def _shape_targets(result: BenchResult) -> list[Target]:
    """Issue 12: dynamic graphs' steady call vs static, a new-size call vs steady, graphs
    vs Dynamo's eager backend."""
    recs = [r for r in result.records if r.group == "shape" and r.backend == "simaccel"]
    ratios = [r.extra["dynamic_over_static"] for r in recs
              if r.extra.get("dynamic_over_static") is not None]
    new = [r.extra["new_over_steady"] for r in recs if r.extra.get("new_over_steady")]
    out = [Target("simaccel dynamic-size steady call / static", max(ratios) if ratios else None,
                  1.15, "(worst over the kernel workloads)"),
           Target("simaccel call at a new size / steady", new[0] if new else None, 1.5)]
    for scenario in ("batch_sweep[1..64, dynamic=None]", "kv_growth[32 steps]",
                     "kv_static[32 steps]"):
        ours, theirs = result.get(f"shape/{scenario}", "simaccel"), \
            result.get(f"shape/{scenario}", "dynamo_eager")
        value = ours.extra["graphs"] / theirs.extra["graphs"] if ours and theirs and \
            theirs.extra.get("graphs") else None
        out.append(Target(f"simaccel graphs / dynamo_eager graphs, {scenario}", value, 1.0))
    return out


def _same_rounds_ratio(result: BenchResult, what: str) -> float | None:
    """``what`` ("call" or "guard_check") of the lifted frame over the lift="off" frame,
    timed in the same rounds (``None`` where the lifted record lacks them)."""
    lifted = result.get("guard/3_scalars[default]", "simaccel")
    x = lifted.extra if lifted else {}
    a, b = x.get(f"{what}_same_rounds_s"), x.get(f"{what}_off_same_rounds_s")
    return a / b if a and b else None


def _guard_check_ratio(result: BenchResult) -> float | None:
    """Guard evaluation of the lifted frame over the same frame compiled with
    ``lift="off"`` (Dynamo's value guards), both with simaccel's device guards: timed in
    the same rounds where the lifted record has them, else the two records' own."""
    same = _same_rounds_ratio(result, "guard_check")
    if same is not None:
        return same
    lifted = result.get("guard/3_scalars[default]", "simaccel")
    off = result.get("guard/3_scalars[lift_off]", "simaccel")
    if not (lifted and off):
        return None
    a, b = lifted.extra.get("guard_check_s"), off.extra.get("guard_check_s")
    return a / b if a and b else None


#: kernel targets: (workload, largest simaccel/eager time ratio allowed); issue 2's first
KERNEL_TARGETS = (("chain8", 1 / 2), ("row_reductions", 1 / 1.5),
                  ("row_reductions_static", 1 / 1.5), ("sort_last", 1.5), ("topk16", 1.5),
                  ("grouped_conv", 1.5), ("causal_attention", 1.0), ("masked_attention", 1.0),
                  ("causal_attention_bf16", 1.0), ("mlp", 1.0))


#: issue 16's steady-state bounds against a compiled backend: (workload, backend)
KERNEL_VS_BACKEND = tuple(KERNEL_RIVALS.items())


def _kernel_record(result: BenchResult, name: str, backend: str) -> Record | None:
    """``backend``'s full-size record of kernel workload ``name``."""
    return next((r for r in result.records if r.group == "kernel" and r.backend == backend
                 and r.scenario.startswith(name + "[") and not r.skipped
                 and not r.extra.get("quick_sizes")), None)


def _over_eager(result: BenchResult, name: str, backend: str) -> float | None:
    """``backend``'s per-call time over eager's on kernel workload ``name``: timed in the
    same rounds where the record has it, else the two processes' medians."""
    rec = _kernel_record(result, name, backend)
    if rec is None:
        return None
    return rec.extra.get("over_eager") or _median_ratio(result, rec.key, backend, "eager")


def _kernel_targets(result: BenchResult) -> list[Target]:
    """simaccel/eager per-call time of the bounded kernel workloads, and simaccel against
    the other compiled backends, each over eager in its own same rounds (full sizes only:
    the quick sizes measure overhead, not kernels)."""
    out = [Target(f"simaccel {name} / eager (full size)", _over_eager(result, name, "simaccel"),
                  bound, "(same rounds)") for name, bound in KERNEL_TARGETS]
    for name, backend in KERNEL_VS_BACKEND:
        label = f"simaccel {name} / {backend} (full size)"
        rec = _kernel_record(result, name, "simaccel")
        beside = rec.extra.get(f"over_{backend}") if rec is not None else None
        if beside is not None:
            out.append(Target(label, beside, 1.0, "(same rounds)"))
            continue
        ours, theirs = _over_eager(result, name, "simaccel"), _over_eager(result, name, backend)
        out.append(Target(label, ours / theirs if ours and theirs else None, 1.0,
                          "(each over eager timed in its own same rounds)"))
    return out


def to_json(result: BenchResult) -> dict[str, Any]:
    """``{"meta", "results": {backend: {"group/scenario": {...}}}, "skipped", "targets"}``;
    every time in seconds."""
    results: dict[str, dict[str, Any]] = {b: {} for b in result.backends}
    skipped = []
    for rec in result.records:
        if rec.skipped:
            skipped.append({"backend": rec.backend, "scenario": rec.key, "reason": rec.skipped})
            continue
        r, label = ratio(result, rec)
        results.setdefault(rec.backend, {})[rec.key] = {
            "median_s": rec.median_s, "samples": rec.samples,
            "recompiles": rec.extra.get("recompiles", 0), **rec.extra,
            "ratio": r, "ratio_baseline": label}
    return {"meta": result.meta, "results": results, "skipped": skipped,
            "targets": [{"name": t.name, "value": t.value, "target": t.bound, "met": t.met,
                         "note": t.note} for t in targets(result)]}

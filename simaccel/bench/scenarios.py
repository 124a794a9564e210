"""The benchmark scenarios: each one measures one backend on one workload.

Every ``measure_*`` function returns a :class:`Record`; the ``prepare_*`` functions are
the shared first half that the pytest-benchmark suites in ``bench/`` time themselves.
"""
from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from simaccel.bench import measure
from simaccel.bench.coldstart import first_call_in_new_process
from simaccel.bench.workloads import (
    KERNEL_WORKLOADS, SCALAR_SCENARIOS, ScalarScenario, fresh_value, guard_workload, tiny,
)

#: the compile workload run in fresh processes.
COMPILE_WORKLOAD = "mlp3"
#: the workload of the lifting compile-time scenario (coldstart's ``--lift`` workload)
LIFT_WORKLOAD = "scaled_mlp"
#: the config-object model (:mod:`simaccel.bench.configmodel`), compiled the same way
CONFIG_WORKLOAD = "config_model"
#: the GPT-2-style 6-layer decoder (:mod:`simaccel.bench.gpt2`): compile latency at model
#: scale, cold per backend and with both lift settings
MODEL_WORKLOAD = "gpt2"
#: elements of the tensors in the scalar scenarios (per-call overhead dominates).
SCALAR_NUMEL = 64
#: dynamic= settings the scalar scenarios run under.
DYNAMIC_MODES: tuple[bool | None, ...] = (None, False)


@dataclass
class BenchConfig:
    """How much to measure. ``quick``: tiny kernel sizes, fewer samples."""

    quick: bool = False
    #: (changed, steady) call pairs: at least ``min_changed``, then more (up to
    #: ``max_changed``) while the changed calls stay under ``changed_budget_s`` seconds.
    min_changed: int = 3
    max_changed: int = 300
    changed_budget_s: float = 1.0
    #: batches of the batched steady timings (tiny graph, guards, kernels).
    batches: int = 30

    @classmethod
    def make(cls, quick: bool) -> "BenchConfig":
        if quick:
            return cls(quick=True, max_changed=100, changed_budget_s=0.5, batches=15)
        return cls()


@dataclass
class Record:
    """One backend on one scenario. ``median_s``: the headline median (seconds)."""

    group: str
    scenario: str
    backend: str
    median_s: float | None = None
    samples: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    @property
    def key(self) -> str:
        return f"{self.group}/{self.scenario}"


def scalar_id(name: str, dynamic: bool | None) -> str:
    return f"{name}[dynamic={dynamic}]"


# ---------------------------------------------------------------------- scalar lifting


@dataclass
class ScalarRun:
    """A compiled scalar scenario after its first call (the first compile)."""

    compiled: Callable
    args_for: Callable[[Any], tuple]
    kind: str
    steady_value: Any
    first_call_s: float
    graphs_after_first: int

    def changed_args(self) -> tuple:
        """Arguments with a scalar value this process has never used before."""
        return self.args_for(fresh_value(self.kind))

    def steady_args(self) -> tuple:
        """Arguments with the same scalar value on every call."""
        return self.args_for(self.steady_value)


def prepare_scalar(scenario: ScalarScenario, backend: str, dynamic: bool | None,
                   numel: int = SCALAR_NUMEL) -> ScalarRun:
    """Fresh Dynamo, compile, and make the first call. Call under ``recompile_limits()``."""
    measure.fresh_dynamo()
    fn, args_for = scenario.build(numel)
    compiled = measure.compile_for(fn, backend, dynamic)
    value = fresh_value(scenario.kind)
    first = measure.time_call(compiled, args_for(value))
    return ScalarRun(compiled, args_for, scenario.kind, value, first, measure.graphs_compiled())


def time_changed_and_steady(run: ScalarRun, cfg: BenchConfig) -> tuple[list[float], list[float]]:
    """Seconds of calls with a new scalar value each, and of calls with the same value.

    Rounds of (changed, steady untimed, steady timed), so both timed calls see the same
    warm-up, caches and machine load, and the timed steady call really repeats the value
    of the call before it (a backend may cache the last scalar, e.g. in a constant bank):
    at least ``cfg.min_changed`` rounds, more (up to ``cfg.max_changed``) while the
    changed calls fit in ``cfg.changed_budget_s``.
    """
    measure.settle()
    for _ in range(5):  # warm-up at the steady value, untimed
        run.compiled(*run.steady_args())
    changed: list[float] = []
    steady: list[float] = []
    while len(changed) < cfg.max_changed and (
            len(changed) < cfg.min_changed or sum(changed) < cfg.changed_budget_s):
        changed.append(measure.time_call(run.compiled, run.changed_args()))
        run.compiled(*run.steady_args())
        steady.append(measure.time_call(run.compiled, run.steady_args()))
    return changed, steady


def measure_scalar(name: str, backend: str, dynamic: bool | None, cfg: BenchConfig) -> Record:
    """Median of calls whose scalar changed (each a new value) and of steady calls;
    ``recompiles``: graphs compiled during the changed calls (Dynamo's unique_graphs)."""
    with measure.recompile_limits():
        run = prepare_scalar(SCALAR_SCENARIOS[name], backend, dynamic)
        with measure.quiet_gc():
            changed, steady = time_changed_and_steady(run, cfg)
        recompiles = measure.graphs_compiled() - run.graphs_after_first
    steady_s, changed_s = measure.median(steady), measure.median(changed)
    return Record("scalar", scalar_id(name, dynamic), backend, changed_s, len(changed), {
        "recompiles": recompiles, "graphs": measure.graphs_compiled(),
        "first_call_s": run.first_call_s, "steady_median_s": steady_s,
        "changed_vs_steady": changed_s / steady_s if steady_s else None})


# ---------------------------------------------------------------------- steady tiny graph


#: the backend every other compiled backend's tiny call is also timed against, batch by
#: batch in the same rounds (its own record is timed alone, like every backend's)
TINY_BASELINE = "dynamo_eager"


def prepare_tiny(backend: str, fresh: bool = True) -> tuple[Callable, tuple]:
    """``x * 2.0 + 1.0`` on 16 float32 elements, compiled (dynamic=False) and warmed up
    (``fresh``: after resetting Dynamo; else as a copy of the function with a code object
    of its own, so Dynamo keeps its compiled entry apart from the first backend's)."""
    fn = tiny
    if fresh:
        measure.fresh_dynamo()
    else:
        fn = types.FunctionType(tiny.__code__.replace(), tiny.__globals__, "tiny_baseline")
    x = torch.randn(16)
    compiled = measure.compile_for(fn, backend, dynamic=False)
    compiled(x)
    compiled(x)
    return compiled, (x,)


def measure_tiny(backend: str, cfg: BenchConfig) -> Record:
    """Steady per-call time of the tiny graph (median over batches of calls). A backend
    other than eager and :data:`TINY_BASELINE` is timed in the same rounds as the
    baseline (their batches alternate, so both see the same load): ``extra
    ["baseline_s"]`` and ``extra["over_baseline"]``, the ratio of the two medians."""
    compiled, args = prepare_tiny(backend)
    graphs = measure.graphs_compiled()
    extra: dict[str, Any] = {"calls_per_batch": measure.batch_size_for(compiled, args),
                             "graphs": graphs}
    if backend in ("eager", TINY_BASELINE):
        with measure.quiet_gc():
            times = measure.time_batches(compiled, args, cfg.batches, extra["calls_per_batch"])
    else:
        baseline, base_args = prepare_tiny(TINY_BASELINE, fresh=False)
        times, base = _same_rounds((compiled, args, extra["calls_per_batch"]),
                                   (baseline, base_args, measure.batch_size_for(baseline,
                                                                                base_args)),
                                   cfg.batches)
        med, base_med = measure.median(times), measure.median(base)
        extra.update(baseline_s=base_med, over_baseline=med / base_med if med and base_med
                     else None)
    return Record("steady", "tiny_x*2+1_16", backend, measure.median(times), len(times), extra)


def _same_rounds(ours: tuple, theirs: tuple, rounds: int) -> tuple[list[float], list[float]]:
    """Seconds per call of a batch of each ``(fn, args, calls per batch)`` per round,
    which of the two goes first alternating by round."""
    def timer(fn: Callable, args: tuple, batch: int) -> Callable[[], float]:
        return lambda: measure.time_batches(fn, args, 1, batch)[0]
    with measure.quiet_gc():
        return _alternating(timer(*ours), timer(*theirs), rounds)


def _alternating(first: Callable[[], float | None], second: Callable[[], float | None],
                 rounds: int) -> tuple[list[float], list[float]]:
    """Each timing (seconds; None: no figure) once per round, which of the two goes first
    alternating by round, so both see the same load."""
    out: tuple[list[float], list[float]] = ([], [])
    for r in range(rounds):
        for k in ((0, 1) if r % 2 == 0 else (1, 0)):
            seconds = (first, second)[k]()
            if seconds is not None:
                out[k].append(seconds)
    return out


# ---------------------------------------------------------------------- cold / warm compile


def measure_compile(backend: str, phase: str, cache_root: str,
                    workload: str = COMPILE_WORKLOAD) -> Record:
    """First call (trace + compile + run) of ``workload`` (the MLP, or the GPT-2-style
    model) in a new process.

    ``phase`` "cold": ``cache_root`` must be empty; "warm": it holds the cold run's caches.
    """
    result = first_call_in_new_process(backend, cache_root, workload=workload)
    return first_calls_record(f"{phase}_{workload}", backend, [result])


def first_calls_record(scenario: str, backend: str, runs: list[dict[str, Any]]) -> Record:
    """The record of one or more first calls in new processes (their JSON results): the
    median seconds, every run's (``runs_s``) and the fastest, and the median run's
    process time, graphs, compile phases, background-compile time, kernel cache hits,
    lifted scalars and seconds of garbage collection inside the call (``gc_s``)."""
    first = [r["first_call_s"] for r in runs]
    middle = sorted(runs, key=lambda r: r["first_call_s"])[(len(runs) - 1) // 2]
    return Record("compile", scenario, backend, measure.median(first), len(runs),
                  {"runs_s": first, "min_s": min(first), "process_s": middle["process_s"],
                   "graphs": middle["graphs"], "compiled_s": middle.get("compiled_s"),
                   "simaccel_cache_hits": middle.get("kernel_cache_hits"),
                   "phases_s": middle.get("phases_s"), "lifted": middle.get("lifted"),
                   "gc_s": middle.get("gc_s")})


def measure_cold_rounds(backends: Sequence[str], cache_root: str, rounds: int,
                        workload: str = MODEL_WORKLOAD) -> list[Record]:
    """Cold first calls of ``workload`` (each in a new process with its own empty cache
    folder under ``cache_root``) by each of ``backends``, ``rounds`` times, the backends'
    order alternating by round, so a ratio of two of them compares runs made under the
    same load (one cold GPT-2 first call moves by +-20% on a shared 2-core machine); one
    record per backend: the median, with every run's seconds (``extra["runs_s"]``) and
    the median run's compile phases."""
    runs: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
    for i in range(rounds):
        for backend in (backends if i % 2 == 0 else list(reversed(backends))):
            runs[backend].append(first_call_in_new_process(
                backend, os.path.join(cache_root, f"{backend}-{i}"), workload=workload))
    return [first_calls_record(f"cold_{workload}", backend, done)
            for backend, done in runs.items()]


#: decoder depths whose kernel counts are compared (identical layers share kernels)
DEPTHS = (2, 12)


def measure_depth_kernels(cache_root: str) -> list[Record]:
    """The GPT-2-style decoder's first call at each of :data:`DEPTHS` layers, each in a
    new process on empty caches: seconds, with ``extra["kernels_compiled"]`` (numba
    compiles, background ones included)."""
    records = []
    for layers in DEPTHS:
        result = first_call_in_new_process("simaccel", os.path.join(cache_root, f"{layers}"),
                                           workload=MODEL_WORKLOAD, layers=layers)
        records.append(Record("compile", f"layers_{layers}_{MODEL_WORKLOAD}", "simaccel",
                              result["first_call_s"], 1,
                              {"kernels_compiled": result["kernels_compiled"],
                               "process_s": result["process_s"]}))
    return records


def measure_megacache(cache_root: str) -> list[Record]:
    """torch's Mega-Cache round trip on the GPT-2-style decoder, each step a new process:
    a cold first call that saves ``save_cache_artifacts()``, a first call on empty caches
    that loads them first (``megacache_load``, the load timed with it), and a warm first
    call on the cold run's caches (``megacache_warm``, the baseline)."""
    blob = os.path.join(cache_root, "artifacts.bin")
    runs = {"save": first_call_in_new_process("simaccel", os.path.join(cache_root, "cold"),
                                              workload=MODEL_WORKLOAD, save=blob)}
    runs["load"] = first_call_in_new_process("simaccel", os.path.join(cache_root, "empty"),
                                             workload=MODEL_WORKLOAD, load=blob)
    runs["warm"] = first_call_in_new_process("simaccel", os.path.join(cache_root, "cold"),
                                             workload=MODEL_WORKLOAD)
    return [Record("compile", f"megacache_{step}_{MODEL_WORKLOAD}", "simaccel",
                   r["first_call_s"], 1, {"kernels_compiled": r["kernels_compiled"],
                                          "process_s": r["process_s"]})
            for step, r in runs.items()]


def measure_lift_compiles(cache_root: str, workload: str = LIFT_WORKLOAD,
                          rounds: int = 1) -> list[Record]:
    """First call of a scalar workload (the scaled MLP: three Python scalars; the config
    model: 20 settings, two of them operands) in a new process with empty caches, simaccel
    with ``lift`` "off" and "auto" (one re-trace inside the compile): ``rounds`` times
    (off, auto), alternating so both see the same load, each process with its own empty
    cache folder under ``cache_root``; one record per setting (median seconds)."""
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "auto": []}
    for i in range(rounds):
        for lift, done in runs.items():
            done.append(first_call_in_new_process(
                "simaccel", os.path.join(cache_root, f"{lift}-{i}"), lift=lift,
                workload=workload))
    return [first_calls_record(f"lift_{lift}_{workload}", "simaccel", done)
            for lift, done in runs.items()]


# ---------------------------------------------------------------------- kernel throughput


def prepare_kernel(name: str, backend: str, quick: bool) -> tuple[Callable, tuple]:
    """The workload compiled (dynamic=False), run once and checked against eager."""
    _, compiled, args = _checked_workload(name, backend, quick)
    return compiled, args


def _checked_workload(name: str, backend: str, quick: bool) -> tuple[Callable, Callable, tuple]:
    """(the eager function, it compiled by ``backend``, its arguments): see
    :func:`prepare_kernel`. Calling the function itself still runs eager
    (``torch.compile`` wraps it and leaves it as it was)."""
    workload = KERNEL_WORKLOADS[name]
    measure.fresh_dynamo()
    fn, args = workload.make(quick)
    compiled = measure.compile_for(fn, backend, dynamic=False)
    with torch.no_grad():
        expected, actual = fn(*args), compiled(*args)
    rtol, atol = workload.tol_for(backend)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    return fn, compiled, args


#: kernel workloads with a bound against another compiled backend (issue 16: GPT-2,
#: chain and row reductions against inductor): that backend's compiled workload is kept
#: after its own task, and simaccel's task times the two in alternating batches
KERNEL_RIVALS = {"gpt2": "inductor", "chain8": "inductor", "row_reductions": "inductor"}
#: seconds of back-to-back calls a batch beside the rival holds: steady calls, each batch
#: after the other backend's (a GPT-2 forward, ~3.5 ms: 14 calls; at the 5 ms batches of
#: the eager rounds, one call each, every call follows the other backend's and both run
#: ~0.8 ms slower on caches and thread pools the other one left)
RIVAL_BATCH_S = 0.05
#: workload -> (the rival's compiled function, its arguments), until simaccel's task
_KEPT_RIVALS: dict[str, tuple[Callable, tuple]] = {}


def measure_kernel(name: str, backend: str, cfg: BenchConfig) -> Record:
    """Median seconds per call of a kernel workload (batched timing, no_grad). At full
    sizes a compiled backend's batches alternate with plain eager's on the same inputs:
    ``extra["eager_s"]`` and ``extra["over_eager"]`` are that baseline's median and the
    ratio of the two (the same rounds: comparable across backends' processes); simaccel's
    also alternate with its rival's (:func:`_beside_rival`)."""
    fn, compiled, args = _checked_workload(name, backend, cfg.quick)
    if not cfg.quick and KERNEL_RIVALS.get(name) == backend:
        _KEPT_RIVALS[name] = (compiled, args)
    baseline = fn if backend != "eager" and not cfg.quick else None
    extra: dict[str, Any] = {}
    with torch.no_grad(), measure.quiet_gc():
        batch = measure.batch_size_for(compiled, args, budget_s=5e-3)
        device_before = measure.device_counters() if backend == "simaccel" else None
        if baseline is None:
            times = measure.time_batches(compiled, args, cfg.batches, batch)
        else:
            times, eager = measure.time_batches_beside(compiled, baseline, args,
                                                       cfg.batches, batch)
            extra.update(eager_s=measure.median(eager),
                         over_eager=measure.median(times) / measure.median(eager))
    sizes = KERNEL_WORKLOADS[name].sizes[1 if cfg.quick else 0]
    extra.update(calls_per_batch=batch, quick_sizes=cfg.quick)
    if device_before is not None:
        extra["kernel_s_per_call"] = measure.kernel_seconds_per_call(device_before)
    if backend == "simaccel" and not cfg.quick:
        extra.update(_beside_rival(name, functools.partial(compiled, *args), cfg.batches))
    return Record("kernel", f"{name}[{sizes}]", backend, measure.median(times), len(times),
                  extra)


def _beside_rival(name: str, call: Callable[[], Any], batches: int) -> dict[str, float]:
    """simaccel's ``call`` and the workload's rival (:data:`KERNEL_RIVALS`, kept by the
    rival's own task earlier in this run) timed in alternating batches of
    :data:`RIVAL_BATCH_S`:
    ``{"<rival>_same_rounds_s": its median, "over_<rival>": ours over it}``. One ratio of
    two backends sharing the machine's load, where each one's ratio over eager comes
    from its own rounds, minutes apart (dividing those two moved GPT-2's between 0.92
    and 1.21 across runs of the same code). Empty when the rival did not run."""
    kept = _KEPT_RIVALS.pop(name, None)
    if kept is None:
        return {}
    rival, rival_args = kept
    theirs_call = functools.partial(rival, *rival_args)
    with torch.no_grad(), measure.quiet_gc():
        for _ in range(2):  # Dynamo was reset for simaccel: the rival compiles again
            theirs_call()
        batch = measure.batch_size_for(call, (), budget_s=RIVAL_BATCH_S)
        ours, theirs = measure.time_batches_beside(call, theirs_call, (), batches, batch)
    backend = KERNEL_RIVALS[name]
    return {f"{backend}_same_rounds_s": measure.median(theirs),
            f"over_{backend}": measure.median(ours) / measure.median(theirs)}


# ---------------------------------------------------------------------- guard overhead

#: guard variants: default options for every backend, the others for simaccel only.
GUARD_VARIANTS = ("default", "lift_off", "added_guard")


def guard_options(variant: str) -> dict[str, Any] | None:
    """simaccel options of a guard variant; raises ``LookupError`` if ``simaccel.Guard``
    (needed by "added_guard") does not exist yet."""
    if variant == "lift_off":
        return {"lift": "off"}
    if variant == "added_guard":
        import simaccel
        guard_cls = getattr(simaccel, "Guard", None)
        if guard_cls is None:
            raise LookupError("simaccel.Guard does not exist yet (guards issue): "
                              "no backend guard to add")
        return {"guards": [guard_cls("L['n']", lambda n: n > 0, "n_positive")]}
    return None


def prepare_guard(backend: str, variant: str) -> tuple[Callable, tuple, Callable]:
    """Compiled guard workload, warmed up; returns ``(compiled, args, fn)``."""
    measure.fresh_dynamo()
    fn, args = guard_workload()
    options = guard_options(variant) if backend == "simaccel" else None
    compiled = measure.compile_for(fn, backend, dynamic=False, options=options)
    compiled(*args)
    compiled(*args)
    return compiled, args, fn


def measure_guard(backend: str, variant: str, cfg: BenchConfig) -> Record:
    """Steady per-call time with three scalar arguments, plus the guard check alone."""
    scenario = f"3_scalars[{variant}]"
    try:
        compiled, args, fn = prepare_guard(backend, variant)
    except LookupError as exc:
        return Record("guard", scenario, backend, skipped=str(exc))
    batch = measure.batch_size_for(compiled, args)
    with measure.quiet_gc():
        times = measure.time_batches(compiled, args, cfg.batches, batch)
    f_locals = dict(zip(("x", "a", "b", "n"), args))
    check_s = measure.guard_check_seconds(fn, f_locals) if backend != "eager" else None
    extra = {"guard_check_s": check_s, "graphs": measure.graphs_compiled()}
    if backend == "simaccel" and variant == "default":
        extra.update(_lift_off_same_rounds(compiled, fn, args, cfg.batches))
    return Record("guard", scenario, backend, measure.median(times), len(times), extra)


def _lift_off_same_rounds(compiled: Callable, fn: Callable, args: tuple,
                          rounds: int) -> dict[str, float | None]:
    """The lifted frame's steady call and guard check, and the same frame's with
    ``lift="off"`` (compiled on a copy of the code, so Dynamo keeps both entries), timed
    in alternating rounds: a ~2 us guard check timed in separate records on the shared
    machine gave lifted/off ratios of 0.6-1.9. Returns the medians (seconds):
    ``call_same_rounds_s``, ``call_off_same_rounds_s``, ``guard_check_same_rounds_s``
    and ``guard_check_off_same_rounds_s``."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, "guard_lift_off",
                              fn.__defaults__, fn.__closure__)
    off = measure.compile_for(copy, "simaccel", dynamic=False, options=guard_options("lift_off"))
    off(*args)
    off(*args)
    calls = _same_rounds((compiled, args, measure.batch_size_for(compiled, args)),
                         (off, args, measure.batch_size_for(off, args)), rounds)
    f_locals = dict(zip(("x", "a", "b", "n"), args))
    checks = _alternating(lambda: measure.guard_check_seconds(fn, f_locals, repeats=1),
                          lambda: measure.guard_check_seconds(copy, f_locals, repeats=1),
                          max(rounds, 5))
    return {"call_same_rounds_s": measure.median(calls[0]),
            "call_off_same_rounds_s": measure.median(calls[1]),
            "guard_check_same_rounds_s": measure.median(checks[0]),
            "guard_check_off_same_rounds_s": measure.median(checks[1])}

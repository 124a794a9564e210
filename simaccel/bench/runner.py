"""The scenario runner behind ``simaccel bench``: every selected backend on every selected
scenario, in one process (cold/warm compiles in child processes), with a progress line
per measurement on stderr."""
from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

from simaccel.bench import BACKENDS
from simaccel.bench import scenarios as sc
from simaccel.bench.ddp import ddp_tasks
from simaccel.bench.optim import optim_tasks
from simaccel.bench.train import train_tasks
from simaccel.bench.shapes import shape_tasks
from simaccel.bench.workloads import KERNEL_WORKLOADS, SCALAR_SCENARIOS

#: the scenario groups, in the order they run.
GROUPS = ("steady", "scalar", "guard", "kernel", "optim", "shape", "ddp", "compile")


@dataclass
class Task:
    """One measurement to make: ``run()`` returns its :class:`Record` (or several, for
    settings measured in alternation so that they share the machine's load).
    ``opt_in``: runs only when ``--scenarios`` selects it (too slow for a default run)."""

    group: str
    scenario: str
    backend: str
    run: Callable[[], sc.Record | list[sc.Record]]
    opt_in: bool = False

    @property
    def key(self) -> str:
        return f"{self.group}/{self.scenario}"


@dataclass
class BenchResult:
    """Everything one ``simaccel bench`` run measured."""

    records: list[sc.Record]
    backends: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, backend: str) -> sc.Record | None:
        """The record of ``backend`` on scenario ``key`` ("group/scenario"), if measured."""
        for rec in self.records:
            if rec.key == key and rec.backend == backend and rec.skipped is None:
                return rec
        return None


#: backends ``--quick`` leaves out unless ``--backends`` names them: inductor (its compiles
#: take seconds each) and aot_eager (Dynamo + AOTAutograd with eager kernels, a fifth of
#: a quick run; Dynamo's eager backend and plain eager stay as the baselines)
QUICK_SKIPS = ("inductor", "aot_eager")


def default_backends(quick: bool) -> list[str]:
    """All backends; in quick mode without :data:`QUICK_SKIPS`."""
    return [b for b in BACKENDS if not (quick and b in QUICK_SKIPS)]


#: first compiles of the config model per lift setting (quick: 1), alternating; median
CONFIG_COMPILE_ROUNDS = 3
#: cold first calls of the GPT-2 model per backend but inductor, and per lift setting
#: (quick: 1), alternating; median. 3 rounds moved the lift auto/off ratio between 1.00
#: and 1.27 from run to run on the shared 2-core machine (one call: 1.6-2.2 s); each
#: round costs ~9 s per backend, and the scenarios run only when named
COLD_MODEL_ROUNDS = 5


def _compile_tasks(backends: Sequence[str], cfg: sc.BenchConfig, cache_root: str) -> list[Task]:
    """First calls in fresh processes (~5-9 s each). ``--quick`` runs simaccel's cold and
    warm pair only; the other backends' pairs and the lifting pairs run when
    ``--scenarios`` names them (they were two thirds of a quick run's time)."""
    tasks = []
    for backend in backends:
        root = os.path.join(cache_root, backend)
        for phase in ("cold", "warm"):  # warm reuses the cold run's folder
            tasks.append(Task("compile", f"{phase}_{sc.COMPILE_WORKLOAD}", backend,
                              lambda b=backend, p=phase, r=root: sc.measure_compile(b, p, r),
                              opt_in=cfg.quick and backend != "simaccel"))
    # model scale, only when named: inductor once (15-30 s a compile), the others
    # alternating round by round (median)
    alternated = [b for b in backends if b != "inductor"]
    cold_rounds = 1 if cfg.quick else COLD_MODEL_ROUNDS
    root = os.path.join(cache_root, f"{sc.MODEL_WORKLOAD}-cold")
    if alternated:
        tasks.append(Task("compile", f"cold_{sc.MODEL_WORKLOAD}", "+".join(alternated),
                          lambda r=root, a=alternated, n=cold_rounds:
                          sc.measure_cold_rounds(a, r, n), opt_in=True))
    if "inductor" in backends:
        root = os.path.join(cache_root, f"{sc.MODEL_WORKLOAD}-inductor")
        tasks.append(Task("compile", f"cold_{sc.MODEL_WORKLOAD}", "inductor",
                          lambda r=root: sc.measure_compile("inductor", "cold", r,
                                                            sc.MODEL_WORKLOAD), opt_in=True))
    if "simaccel" not in backends:
        return tasks
    rounds = {sc.LIFT_WORKLOAD: 1, sc.CONFIG_WORKLOAD: 1 if cfg.quick else CONFIG_COMPILE_ROUNDS}
    for workload, n in rounds.items():  # first compile with the lifting re-trace, and without
        root = os.path.join(cache_root, f"lift-{workload}")
        tasks.append(Task("compile", f"lift_off+auto_{workload}", "simaccel",
                          lambda r=root, w=workload, n=n: sc.measure_lift_compiles(r, w, n),
                          opt_in=cfg.quick))
    root = os.path.join(cache_root, f"lift-{sc.MODEL_WORKLOAD}")
    tasks.append(Task("compile", f"lift_off+auto_{sc.MODEL_WORKLOAD}", "simaccel",
                      lambda r=root, n=cold_rounds: sc.measure_lift_compiles(
                          r, sc.MODEL_WORKLOAD, n), opt_in=True))
    root = os.path.join(cache_root, f"layers-{sc.MODEL_WORKLOAD}")
    tasks.append(Task("compile", f"layers_2+12_{sc.MODEL_WORKLOAD}", "simaccel",
                      lambda r=root: sc.measure_depth_kernels(r), opt_in=True))
    root = os.path.join(cache_root, f"megacache-{sc.MODEL_WORKLOAD}")
    tasks.append(Task("compile", f"megacache_{sc.MODEL_WORKLOAD}", "simaccel",
                      lambda r=root: sc.measure_megacache(r), opt_in=True))
    return tasks


def build_tasks(backends: Sequence[str], cfg: sc.BenchConfig, cache_root: str) -> list[Task]:
    """Every (scenario, backend) measurement, grouped as in :data:`GROUPS`."""
    tasks = [Task("steady", "tiny_x*2+1_16", b, lambda b=b: sc.measure_tiny(b, cfg))
             for b in backends]
    for dynamic in sc.DYNAMIC_MODES:  # quick: Dynamo's default (None) unless named
        for name in SCALAR_SCENARIOS:
            tasks += [Task("scalar", sc.scalar_id(name, dynamic), b,
                           lambda n=name, b=b, d=dynamic: sc.measure_scalar(n, b, d, cfg),
                           opt_in=cfg.quick and dynamic is not None)
                      for b in backends]
    for variant in sc.GUARD_VARIANTS:
        tasks += [Task("guard", f"3_scalars[{variant}]", b,
                       lambda b=b, v=variant: sc.measure_guard(b, v, cfg))
                  for b in backends if variant == "default" or b == "simaccel"]
    for name in KERNEL_WORKLOADS:
        scenario = f"{name}[{KERNEL_WORKLOADS[name].sizes[1 if cfg.quick else 0]}]"
        # quick sizes measure per-call overhead and give no kernel verdict: plain eager is
        # their baseline, Dynamo eager's kernel rows run when --scenarios names them
        tasks += [Task("kernel", scenario, b, lambda n=name, b=b: sc.measure_kernel(n, b, cfg),
                       opt_in=cfg.quick and (not KERNEL_WORKLOADS[name].in_quick
                                             or b == "dynamo_eager"))
                  for b in backends]
    # quick: the baseline and simaccel only (Dynamo eager's optimizer steps take 2.5 s of
    # a quick run's ~60, its training step compiles three graphs; each runs when named)
    tasks += [Task(t.group, t.scenario, t.backend, t.run,
                   opt_in=cfg.quick and t.backend not in ("eager", "simaccel"))
              for t in [*optim_tasks(list(backends), cfg, Task),
                        *train_tasks(list(backends), cfg, Task)]]
    tasks += shape_tasks(list(backends), cfg, Task)
    tasks += ddp_tasks(list(backends), cfg, Task)
    return tasks + _compile_tasks(backends, cfg, cache_root)


def select(tasks: list[Task], patterns: Sequence[str] | None) -> list[Task]:
    """Tasks whose key ("group/scenario") contains one of ``patterns`` (all but the
    ``opt_in`` ones if none).

    Warm compiles pull in the cold compile of the same backend (they reuse its caches).
    """
    if not patterns:
        return [t for t in tasks if not t.opt_in]
    chosen = [t for t in tasks if any(p in t.key for p in patterns)]
    needed = {(t.backend, t.key.replace("warm_", "cold_")) for t in chosen
              if t.key.startswith("compile/warm_")}
    chosen_ids = {id(t) for t in chosen}
    return [t for t in tasks if id(t) in chosen_ids or (t.backend, t.key) in needed]


@contextlib.contextmanager
def private_caches() -> Iterator[str]:
    """A fresh temporary folder for every cache of the run (simaccel kernels, inductor),
    so no result depends on an earlier run; removed on exit. In-process measurements time
    compiled kernels only (``SIMACCEL_TIER0=0``); the first calls in new processes run as
    a user's do (:func:`simaccel.bench.coldstart.cache_env`)."""
    root = tempfile.mkdtemp(prefix="simaccel-bench-")
    saved = {k: os.environ.get(k)
             for k in ("SIMACCEL_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "SIMACCEL_TIER0")}
    os.environ["SIMACCEL_CACHE_DIR"] = os.path.join(root, "inproc", "simaccel")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inproc", "inductor")
    os.environ["SIMACCEL_TIER0"] = "0"
    try:
        yield os.path.join(root, "subprocess")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)


def _progress_line(i: int, n: int, rec: sc.Record, seconds: float) -> str:
    if rec.skipped:
        what = f"skipped: {rec.skipped}"
    elif rec.median_s is None:
        what = "no samples"
    else:
        what = f"median {rec.median_s * 1e3:.4g} ms"
        if "recompiles" in rec.extra:
            what += f", {rec.extra['recompiles']} recompiles"
    width = len(str(n))
    return f"[{i:>{width}}/{n}] {rec.key:<44} {rec.backend:<12} {what} ({seconds:.1f} s)"


def _error_summary(exc: BaseException) -> str:
    """One line: the exception type and first line, plus the first ``...Error: ...`` line
    of its message (Dynamo wraps the backend's real error in a long text)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = type(exc).__name__ + (f": {lines[0]}" if lines else "")
    inner = next((ln for ln in lines[1:] if re.match(r"^[\w.]+(Error|Exception): ", ln)), None)
    return f"{text} {inner}" if inner else text


def _run_one(task: Task) -> list[sc.Record]:
    try:
        result = task.run()
    except Exception as exc:  # one broken backend/scenario must not lose the whole run
        message = _error_summary(exc)
        return [sc.Record(task.group, task.scenario, task.backend, skipped=f"error: {message}")]
    return result if isinstance(result, list) else [result]


def run_tasks(tasks: list[Task], progress: TextIO | None) -> list[sc.Record]:
    """Run ``tasks`` in order; one progress line per record on ``progress``."""
    records = []
    for i, task in enumerate(tasks, 1):
        start = time.perf_counter()
        recs = _run_one(task)
        records += recs
        if progress is not None:
            for rec in recs:
                print(_progress_line(i, len(tasks), rec, time.perf_counter() - start),
                      file=progress, flush=True)
    return records


@contextlib.contextmanager
def compute_threads(threads: int | None) -> Iterator[None]:
    """Run torch's and numba's kernels on ``threads`` threads (``None``: leave as is);
    child processes get it as ``OMP_NUM_THREADS`` (torch's intra-op threads).

    ``NUMBA_NUM_THREADS`` is left alone: changing it after numba's pool started makes
    numba refuse to load cached kernels.
    """
    if threads is None:
        yield
        return
    import numba
    saved = (torch.get_num_threads(), numba.get_num_threads(), os.environ.get("OMP_NUM_THREADS"))
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved[0])
        numba.set_num_threads(saved[1])
        if saved[2] is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved[2]


def run_bench(backends: Sequence[str] | None = None, quick: bool = False,
              scenarios: Sequence[str] | None = None, threads: int | None = None,
              progress: TextIO | None = sys.stderr) -> BenchResult:
    """Measure ``backends`` (default: :func:`default_backends`) on the selected scenarios;
    ``threads``: compute threads for torch and numba (default: their own defaults)."""
    chosen = list(backends) if backends else default_backends(quick)
    cfg = sc.BenchConfig.make(quick)
    start = time.time()
    with private_caches() as cache_root, compute_threads(threads):
        tasks = select(build_tasks(chosen, cfg, cache_root), scenarios)
        meta = {"quick": quick, "backends": chosen, "scenarios": list(scenarios or []),
                "torch": torch.__version__, "python": platform.python_version(),
                "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                "load_avg_1m_start": _load_avg(), "started": start}
        records = run_tasks(tasks, progress)
    meta.update(load_avg_1m_end=_load_avg(), wall_s=time.time() - start)
    return BenchResult(records, chosen, meta)


def _load_avg() -> float | None:
    """The 1-minute load average, rounded to 2 decimals (the kernel keeps ~3); ``None``
    where the platform has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None

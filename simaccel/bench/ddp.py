"""``ddp/`` scenario: a data-parallel training step on 2 gloo ranks (processes) on
127.0.0.1, ``DDP(torch.compile(mlp))`` with 5 gradient buckets
(:mod:`simaccel.examples.ddp_train`: SGD-momentum, LambdaLR changing lr every step).

One job runs every backend in turn on both ranks (so they share the machine's load);
per backend the headline is the slower rank's median seconds per training step over the
timed steps (after warm-up steps that include the compiles), with plain eager DDP as the
baseline. ``extra``: each rank's median, Dynamo graphs, the collective DMA bytes per step
and the fraction of the simulated collective time hidden under backward kernels
(simaccel only). Runs only when ``--scenarios`` selects it (two processes, ~30-60 s).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simaccel.bench import measure
from simaccel.bench.scenarios import BenchConfig, Record

#: bench backend name -> the training run's backend ("none": eager DDP, nothing compiled)
RUN_BACKENDS = {"eager": "none", "dynamo_eager": "eager", "aot_eager": "aot_eager",
                "simaccel": "simaccel"}
SCENARIO = "mlp_5_buckets_train_step[2 ranks]"


def _steps(cfg: BenchConfig) -> tuple[int, int]:
    """(warm-up steps, timed steps)."""
    return (3, 6) if cfg.quick else (3, 20)


def measure_ddp(backends: list[str], cfg: BenchConfig) -> list[Record]:
    """One 2-rank job over ``backends`` (see the module doc)."""
    from simaccel.distributed import spawn
    from simaccel.examples.ddp_train import RunSpec, training_job
    warmup, timed = _steps(cfg)
    names = [b for b in backends if b in RUN_BACKENDS]
    specs = [RunSpec("mlp", RUN_BACKENDS[b], warmup + timed) for b in names]
    per_rank = spawn(training_job, 2, (specs,), timeout_s=900)
    return [_record(name, [runs[k] for runs in per_rank], warmup)
            for k, name in enumerate(names)]


def _record(backend: str, runs: list[Any], warmup: int) -> Record:
    medians = [measure.median(run.step_s[warmup:]) for run in runs]
    first = runs[0]
    steps = len(first.step_s)
    collective = first.device.get("collective.d2h.bytes", 0)
    return Record("ddp", SCENARIO, backend, max(medians), steps - warmup, {
        "rank_medians_s": medians, "graphs": first.unique_graphs[-1],
        "collective_bytes_per_step": collective / steps if collective else None,
        "hidden_fraction": first.overlap.get("hidden_fraction") if collective else None,
        "host_fallback_ops": first.device.get("host_fallback_ops"),
        "kernel_launches": first.device.get("kernel_launches")})


def ddp_tasks(backends: list[str], cfg: BenchConfig, task: Callable[..., Any]) -> list[Any]:
    """The ``ddp`` group's task (one, returning a record per backend; opt-in)."""
    chosen = [b for b in backends if b in RUN_BACKENDS]
    if not chosen:
        return []
    return [task("ddp", SCENARIO, "simaccel", lambda: measure_ddp(chosen, cfg),
                 opt_in=True)]

"""``optim/`` scenarios: a compiled optimizer step, ``torch.compile(opt.step)``, with a
``LambdaLR`` scheduler giving ``param_groups[0]["lr"]`` a new Python float every step.

Workloads: AdamW and SGD with momentum 0.9 on 10 parameters of 64x64, the size the
targets are set at (``--quick`` runs fewer rounds of the same steps: on smaller
parameters a step is Dynamo's and the optimizer's Python, ~30 us, against eager's ~40),
each with a fixed random gradient. Per backend (plain eager ``opt.step()`` is the
baseline): warm-up steps (the compiles and any recompiles), checked against an eager copy
of the optimizer stepped alongside, then rounds of steps. Each round times the step of
the backend and the step of the eager copy (interleaved, so both see the same load):

* ``median_s`` / ``extra["min_s"]``: median and min over rounds of the mean seconds per
  step (the scheduler's own step is not timed);
* ``extra["eager_s"]``, ``extra["over_eager"]``: the eager copy's median over the same
  rounds and the ratio of the two medians;
* ``extra["graphs"]``: Dynamo's unique graphs over all steps, ``extra["recompiles"]``
  those compiled after the first step, ``extra["recompiles_timed"]`` during the rounds.

Dynamo's recompile limits stay at their defaults (8 graphs per frame): a backend that
recompiles on every new lr falls back to running the frame eagerly at the limit
(``extra["hit_recompile_limit"]``), as it does for a user.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import optim
from torch._dynamo.utils import counters
from torch.optim import lr_scheduler

from simaccel.bench import measure
from simaccel.bench.scenarios import BenchConfig, Record

#: name -> (optimizer class, its options)
OPTIMIZERS: dict[str, tuple[type, dict[str, Any]]] = {
    "adamw": (optim.AdamW, {"lr": 0.01}),
    "sgd_momentum": (optim.SGD, {"lr": 0.05, "momentum": 0.9}),
}
#: optimizers whose state (SGD's momentum buffer) the first step creates: the first step
#: and the later ones are two programs for every Dynamo backend (``len(state) == 0``), so
#: one eager step runs before compiling (as in the tests' compiled optimizer steps)
STATE_MADE_BY_FIRST_STEP = frozenset({"sgd_momentum"})
#: (rtol, atol) of the parameters after the warm-up steps against the eager copy's
CHECK_TOL = (1e-4, 1e-5)


@dataclass(frozen=True)
class OptimSizes:
    """``params`` parameters of ``side`` x ``side``; ``warmup`` untimed steps, then
    ``rounds`` rounds of ``steps`` timed steps each."""

    params: int
    side: int
    warmup: int
    rounds: int
    steps: int

    @property
    def label(self) -> str:
        return f"{self.params}x{self.side}x{self.side}"


FULL = OptimSizes(params=10, side=64, warmup=12, rounds=15, steps=10)
QUICK = OptimSizes(params=10, side=64, warmup=10, rounds=5, steps=10)


def sizes_for(cfg: BenchConfig) -> OptimSizes:
    return QUICK if cfg.quick else FULL


def scenario_id(name: str, sizes: OptimSizes) -> str:
    return f"{name}_step[{sizes.label}]"


@dataclass
class StepPair:
    """An optimizer and its eager copy on equal parameters with equal fixed gradients,
    each with its own scheduler."""

    params: list[torch.nn.Parameter]
    reference: list[torch.nn.Parameter]
    opt: optim.Optimizer
    ref_opt: optim.Optimizer
    schedulers: tuple[Any, Any]

    def scheduler_step(self) -> None:
        for sched in self.schedulers:
            sched.step()


def lambda_lr(opt: optim.Optimizer) -> Any:
    """lr = base / (1 + step): a new float at every step."""
    return lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))


def make_pair(name: str, sizes: OptimSizes) -> StepPair:
    """The pair, after the eager first step of :data:`STATE_MADE_BY_FIRST_STEP`."""
    cls, options = OPTIMIZERS[name]
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(sizes.side, sizes.side))
              for _ in range(sizes.params)]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, r in zip(params, reference):
        grad = torch.randn_like(p)
        p.grad, r.grad = grad.clone(), grad.clone()
    opt, ref_opt = cls(params, foreach=False, **options), cls(reference, foreach=False,
                                                                **options)
    if name in STATE_MADE_BY_FIRST_STEP:
        opt.step()
        ref_opt.step()
    return StepPair(params, reference, opt, ref_opt, (lambda_lr(opt), lambda_lr(ref_opt)))


def _warm_up(pair: StepPair, step: Callable[[], Any], steps: int) -> int:
    """``steps`` steps of both optimizers; returns the graphs compiled by the first."""
    graphs_first = 0
    for i in range(steps):
        step()
        pair.ref_opt.step()
        pair.scheduler_step()
        if i == 0:
            graphs_first = measure.graphs_compiled()
    with torch.no_grad():
        for p, r in zip(pair.params, pair.reference):
            torch.testing.assert_close(p, r, rtol=CHECK_TOL[0], atol=CHECK_TOL[1])
    return graphs_first


def _timed_rounds(pair: StepPair, step: Callable[[], Any], sizes: OptimSizes
                  ) -> tuple[list[float], list[float]]:
    """Mean seconds per step of each round: the backend's and the eager copy's (which of
    the two steps first alternates by round: neither gets the warmer caches throughout)."""
    fns = (step, pair.ref_opt.step)
    measure.settle()
    ours, eager = [], []
    for i in range(sizes.rounds):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        spent = [0.0, 0.0]
        for _ in range(sizes.steps):
            for k in order:
                spent[k] += measure.time_call(fns[k], ())
            pair.scheduler_step()
        ours.append(spent[0] / sizes.steps)
        eager.append(spent[1] / sizes.steps)
    return ours, eager


def hit_recompile_limit() -> bool:
    """Whether Dynamo gave up recompiling a frame (its "recompile limit" message)."""
    return any("recompile limit" in str(key).lower() for key in counters["unimplemented"])


def measure_optim(name: str, backend: str, cfg: BenchConfig) -> Record:
    """Steady seconds per ``opt.step()`` of ``backend`` (see the module docstring)."""
    sizes = sizes_for(cfg)
    measure.fresh_dynamo()
    pair = make_pair(name, sizes)
    step = measure.compile_for(pair.opt.step, backend)
    graphs_first = _warm_up(pair, step, sizes.warmup)
    graphs_warm = measure.graphs_compiled()
    with measure.quiet_gc():
        ours, eager = _timed_rounds(pair, step, sizes)
    graphs = measure.graphs_compiled()
    med, eager_med = measure.median(ours), measure.median(eager)
    return Record("optim", scenario_id(name, sizes), backend, med, len(ours), {
        "min_s": min(ours), "eager_s": eager_med,
        "over_eager": med / eager_med if med and eager_med else None,
        "graphs": graphs, "recompiles": graphs - graphs_first,
        "recompiles_timed": graphs - graphs_warm, "hit_recompile_limit": hit_recompile_limit(),
        "steps": sizes.warmup + sizes.rounds * sizes.steps, "quick_sizes": sizes.label != FULL.label})


def optim_tasks(backends: list[str], cfg: BenchConfig, task: Callable[..., Any]) -> list[Any]:
    """The ``optim`` group's tasks (``task(group, scenario, backend, fn)`` makes one)."""
    sizes = sizes_for(cfg)
    return [task("optim", scenario_id(name, sizes), b,
                 lambda n=name, b=b: measure_optim(n, b, cfg))
            for name in OPTIMIZERS for b in backends]

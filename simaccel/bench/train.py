"""``optim/`` training-step scenario: a whole SGD-momentum training step as users write
it, not the optimizer step alone.

Workload: an MLP 256-512-512-10 with ReLUs, batch 64, cross-entropy loss;
``torch.compile(model)`` and ``torch.compile(opt.step)`` (SGD, momentum 0.9, a
``LambdaLR`` changing the lr every step), ``zero_grad(set_to_none=True)``: forward,
backward, step. Per backend (plain eager is the baseline): warm-up steps on a fixed set of
batches, the parameters checked against an eager copy trained alongside on the same
batches, then rounds of steps, each round timing the backend's step and the eager copy's
(interleaved, the order alternating by round), as the ``optim`` scenarios do
(:mod:`simaccel.bench.optim`: the same ``extra`` fields, and ``over_eager``, the ratio of
the two medians, is the target's figure).

Where a step's time goes: each step is timed in :data:`PHASES` as well, and
``step_phases_s`` / ``eager_step_phases_s`` are the backend's and the eager copy's median
seconds per phase over the same rounds. Their differences locate a backend's cost: Dynamo's
own frames (``dynamo_eager``, which runs the captured ops unfused, adds nearly all of its
cost in ``forward`` and ``step``), a compiled graph's calls, its kernels' gains.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn, optim

from simaccel.bench import measure
from simaccel.bench.optim import CHECK_TOL, FULL, hit_recompile_limit, lambda_lr, sizes_for
from simaccel.bench.scenarios import BenchConfig, Record

#: the layer widths, batch and classes of the workload
WIDTHS = (256, 512, 512, 10)
BATCH = 64
#: distinct batches the steps cycle through
BATCHES = 4
SCENARIO = f"mlp_train_step[sgd_momentum,mlp{'-'.join(map(str, WIDTHS))},b{BATCH}]"
#: the parts of a step timed apart: ``model(x)``; the loss and ``backward()``;
#: ``opt.step()``; ``zero_grad(set_to_none=True)``
PHASES = ("forward", "backward", "step", "zero_grad")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for k, (n_in, n_out) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        layers += [nn.Linear(n_in, n_out)] + ([nn.ReLU()] if k < len(WIDTHS) - 2 else [])
    return nn.Sequential(*layers)


@dataclass
class Trainer:
    """One model, its optimizer and scheduler, and how a step calls them."""

    model: nn.Module
    opt: optim.Optimizer
    scheduler: Any
    forward: Callable[[torch.Tensor], torch.Tensor]
    step: Callable[[], Any]
    #: ns spent in each of :data:`PHASES` since :meth:`new_round`
    spent_ns: list[int] = field(default_factory=lambda: [0] * len(PHASES))
    #: per finished round, the mean seconds per step in each phase
    rounds: list[list[float]] = field(default_factory=list)

    def train(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Forward, backward, optimizer step, gradients set to None (each phase's time
        added to :attr:`spent_ns`: five clock reads, ~0.3 us a step)."""
        clock = time.perf_counter_ns
        start = clock()
        out = self.forward(x)
        forward = clock()
        nn.functional.cross_entropy(out, y).backward()
        backward = clock()
        self.step()
        step = clock()
        self.opt.zero_grad(set_to_none=True)
        end = clock()
        spent = self.spent_ns
        spent[0] += forward - start
        spent[1] += backward - forward
        spent[2] += step - backward
        spent[3] += end - step

    def new_round(self) -> None:
        """Start counting a round's phases."""
        self.spent_ns = [0] * len(PHASES)

    def end_round(self, steps: int) -> None:
        """Keep the round's mean seconds per step in each phase."""
        self.rounds.append([ns * 1e-9 / steps for ns in self.spent_ns])

    def phase_medians(self) -> dict[str, float]:
        """Median over the rounds of each phase's seconds per step."""
        return {name: measure.median(list(values))
                for name, values in zip(PHASES, zip(*self.rounds))} if self.rounds else {}


def _trainer(backend: str) -> Trainer:
    model = _mlp()
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=False)
    return Trainer(model, opt, lambda_lr(opt), measure.compile_for(model, backend),
                   measure.compile_for(opt.step, backend))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, WIDTHS[0], generator=gen),
             torch.randint(0, WIDTHS[-1], (BATCH,), generator=gen)) for _ in range(BATCHES)]


def _warm_up(ours: Trainer, eager: Trainer, batches: list, steps: int) -> int:
    """``steps`` steps of both; returns the graphs compiled by the first step."""
    graphs_first = 0
    for i in range(steps):
        for trainer in (ours, eager):
            trainer.train(*batches[i % len(batches)])
            trainer.scheduler.step()
        if i == 0:
            graphs_first = measure.graphs_compiled()
    with torch.no_grad():
        for p, r in zip(ours.model.parameters(), eager.model.parameters()):
            torch.testing.assert_close(p, r, rtol=CHECK_TOL[0], atol=CHECK_TOL[1] * 10)
    return graphs_first


def _timed_rounds(ours: Trainer, eager: Trainer, batches: list, rounds: int, steps: int
                  ) -> tuple[list[float], list[float]]:
    """Mean seconds per training step of each round, the backend's and the eager copy's
    (the scheduler steps untimed)."""
    trainers = (ours, eager)
    measure.settle()
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(rounds):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        spent = [0.0, 0.0]
        for trainer in trainers:
            trainer.new_round()
        for s in range(steps):
            batch = batches[s % len(batches)]
            for k in order:
                spent[k] += measure.time_call(trainers[k].train, batch)
                trainers[k].scheduler.step()
        for k in (0, 1):
            times[k].append(spent[k] / steps)
            trainers[k].end_round(steps)
    return times


def measure_train(backend: str, cfg: BenchConfig) -> Record:
    """Steady seconds per training step of ``backend`` (see the module docstring)."""
    sizes = sizes_for(cfg)
    measure.fresh_dynamo()
    ours, eager = _trainer(backend), _trainer("eager")
    batches = _batches()
    graphs_first = _warm_up(ours, eager, batches, sizes.warmup)
    graphs_warm = measure.graphs_compiled()
    with measure.quiet_gc():
        mine, theirs = _timed_rounds(ours, eager, batches, sizes.rounds, sizes.steps)
    graphs = measure.graphs_compiled()
    med, eager_med = measure.median(mine), measure.median(theirs)
    return Record("optim", SCENARIO, backend, med, len(mine), {
        "min_s": min(mine), "eager_s": eager_med,
        "over_eager": med / eager_med if med and eager_med else None,
        "graphs": graphs, "recompiles": graphs - graphs_first,
        "recompiles_timed": graphs - graphs_warm, "hit_recompile_limit": hit_recompile_limit(),
        "steps": sizes.warmup + sizes.rounds * sizes.steps,
        "quick_sizes": sizes.label != FULL.label,
        "step_phases_s": ours.phase_medians(), "eager_step_phases_s": eager.phase_medians()})


def train_tasks(backends: list[str], cfg: BenchConfig, task: Callable[..., Any]) -> list[Any]:
    """The training-step task per backend (``task(group, scenario, backend, fn)``)."""
    return [task("optim", SCENARIO, b, lambda b=b: measure_train(b, cfg)) for b in backends]

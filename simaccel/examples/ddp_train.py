"""Data-parallel training runs shared by ``simaccel demo --ddp``, the ``ddp`` bench
scenario and the tests: one function a rank calls, comparable across backends.

:func:`train_on_rank` trains one model for a number of steps under
``DistributedDataParallel`` (each rank gets its own batch; every rank starts from the same
weights), with SGD-momentum whose learning rate a ``LambdaLR`` schedule changes every step,
and returns what a comparison needs: losses, final parameters, graph counts, device
counters and step times.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

#: the backends a run can use: "none" is eager DDP (nothing compiled)
BACKENDS = ("none", "simaccel", "eager", "aot_eager")


@dataclass(frozen=True)
class RunSpec:
    """One training run. ``model``: "mlp" or "transformer"; ``backend``: one of
    :data:`BACKENDS` (the model is compiled, DDP outside: ``DDP(torch.compile(m))``);
    ``compile_optimizer``: the optimizer step is compiled with the same backend (from the
    second step: the first creates SGD's momentum buffers, a change of optimizer state
    every backend compiles a second graph for, as the bench's optim scenarios do);
    ``bucket_cap_mb``: DDP's bucket size (MB), which sets how many splits DDPOptimizer
    makes."""

    model: str = "mlp"
    backend: str = "simaccel"
    steps: int = 10
    bucket_cap_mb: float = 1.0
    compile_optimizer: bool = False
    batch: int = 16
    #: ``torch.compile(DDP(model))`` instead of ``DDP(torch.compile(model))``
    compile_outside: bool = False


@dataclass
class RunResult:
    """What one rank saw in one run. ``step_s``: wall time of each step (seconds);
    ``unique_graphs``: Dynamo's count after each step; ``device``: runtime_stats and
    dma_stats of the rank's device at the end; ``overlap``: collective_overlap()."""

    spec: RunSpec
    rank: int
    losses: list[float] = field(default_factory=list)
    params: list[torch.Tensor] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    unique_graphs: list[int] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    device: dict[str, Any] = field(default_factory=dict)
    overlap: dict[str, float] = field(default_factory=dict)
    reports: list[str] = field(default_factory=list)
    grad_bytes: int = 0


def build_model(name: str) -> tuple[nn.Module, Any]:
    """A model (same weights on every rank) and a function making a rank's batch
    ``(inputs, targets)`` for a step."""
    torch.manual_seed(0)
    if name == "mlp":  # ~4.5 MB of float32 parameters: four 1 MB layers
        layers: list[nn.Module] = [nn.Linear(256, 512), nn.ReLU()]
        for _ in range(4):
            layers += [nn.Linear(512, 512), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(512, 8))
        return model, lambda g, b: (torch.randn(b, 256, generator=g),
                                    torch.randn(b, 8, generator=g))
    if name == "transformer":
        return TransformerLM(), lambda g, b: (torch.randint(0, 64, (b, 16), generator=g),
                                              torch.randint(0, 64, (b, 16), generator=g))
    raise ValueError(f"unknown model {name!r}: 'mlp' or 'transformer'")


class TransformerLM(nn.Module):
    """Embedding, one pre-norm transformer block (causal attention, GELU MLP), LM head."""

    def __init__(self, vocab: int = 64, dim: int = 64, heads: int = 4, context: int = 16):
        super().__init__()
        from simaccel.demo import TinyBlock
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(context, dim) * 0.02)
        self.block = TinyBlock(dim, heads)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.tok(tokens) + self.pos))


def _loss(name: str, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if name == "mlp":
        return F.mse_loss(out, target)
    return F.cross_entropy(out.flatten(0, 1), target.flatten())


def train_on_rank(rank: int, spec: RunSpec) -> RunResult:
    """Run ``spec`` on this rank (the process group is up); see the module doc."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from torch.nn.parallel import DistributedDataParallel as DDP

    import simaccel
    from simaccel.distributed.attach import attach
    from simaccel.distributed.overlap import collective_overlap

    torch._dynamo.reset()
    counters.clear()
    simaccel.clear_reports()
    device = simaccel.get_device()
    device.reset_stats()
    module, batch_of = build_model(spec.model)
    compiled = spec.backend != "none"
    if spec.compile_outside:
        ddp = DDP(module, bucket_cap_mb=spec.bucket_cap_mb)
        if spec.backend == "simaccel":
            attach(ddp)  # Dynamo traces DDP's forward: no DDP forward runs at compile time
        model = torch.compile(ddp, backend=spec.backend) if compiled else ddp
    else:
        inner = torch.compile(module, backend=spec.backend) if compiled else module
        model = DDP(inner, bucket_cap_mb=spec.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.9 ** step)
    compiled_step = opt.step
    if spec.compile_optimizer and spec.backend != "none":
        compiled_step = torch.compile(opt.step, backend=spec.backend)
    result = RunResult(spec, rank, grad_bytes=sum(p.numel() * p.element_size()
                                                  for p in module.parameters()))
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(spec.steps):
        inputs, target = batch_of(gen, spec.batch)
        start = time.perf_counter()
        loss = _loss(spec.model, model(inputs), target)
        loss.backward()
        (compiled_step if step else opt.step)()
        opt.zero_grad(set_to_none=True)
        result.step_s.append(time.perf_counter() - start)
        result.losses.append(loss.item())
        result.lrs.append(opt.param_groups[0]["lr"])
        result.unique_graphs.append(int(counters["stats"]["unique_graphs"]))
        schedule.step()
    result.params = [p.detach().clone() for p in module.parameters()]
    result.device = {**device.runtime_stats(), **device.dma_stats()}
    result.overlap = collective_overlap(device)
    result.reports = [f"{r.graph}: {r.ddp}" for r in simaccel.reports()]
    return result


def training_job(rank: int, world_size: int, specs: list[RunSpec]) -> list[RunResult]:
    """What :func:`simaccel.distributed.spawn` runs on each rank: every spec in turn."""
    return [train_on_rank(rank, spec) for spec in specs]

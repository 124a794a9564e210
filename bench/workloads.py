"""Workloads shared by the benchmark suites and ``simaccel bench``."""
from __future__ import annotations

import torch
import torch.nn as nn

#: backends compared side by side in one run; "eager" is plain PyTorch without Dynamo.
BACKENDS = ("eager", "dynamo_eager", "aot_eager", "inductor", "simaccel")


def compile_for(fn, backend: str, dynamic: bool | None = None):
    """``fn`` compiled by ``backend`` (plain ``fn`` for "eager")."""
    if backend == "eager":
        return fn
    name = "eager" if backend == "dynamo_eager" else backend
    return torch.compile(fn, backend=name, dynamic=dynamic)


def chain8(x: torch.Tensor) -> torch.Tensor:
    """Eight pointwise ops: one fused kernel on simaccel."""
    return ((((x * 2.0 + 1.0).sin() - 0.5).abs().sqrt() * 3.0).tanh() + 1.0).relu()


def row_reductions(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x.sum(-1), x.amax(-1), x.mean(-1)


def mlp3(d_in: int = 256, hidden: int = 512, d_out: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, d_out)).eval()


KERNEL_WORKLOADS = {
    "chain8_4M": (chain8, lambda: (torch.randn(4 << 20),)),
    "row_reductions_4096x1024": (row_reductions, lambda: (torch.randn(4096, 1024),)),
}

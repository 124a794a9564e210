"""Compiled ``opt.step`` with a learning-rate scheduler, step by step against eager.

:func:`run_steps` builds two identical parameter sets, one stepped by the compiled
``opt.step`` and one by eager's, feeds both the same gradients and compares them after
every step.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import optim
from torch._dynamo.utils import counters
from torch.optim import lr_scheduler

#: name -> (optimizer class, its options); small models: 3 parameters of 8x8
OPTIMIZERS: dict[str, tuple[type, dict[str, Any]]] = {
    "sgd": (optim.SGD, {"lr": 0.05}),
    "sgd_momentum": (optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    "sgd_nesterov_wd": (optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True,
                                    "weight_decay": 0.01}),
    "adam": (optim.Adam, {"lr": 0.01}),
    "adamw": (optim.AdamW, {"lr": 0.01}),
    "adamw_amsgrad": (optim.AdamW, {"lr": 0.01, "amsgrad": True}),
    "rmsprop_momentum": (optim.RMSprop, {"lr": 0.01, "momentum": 0.9}),
    "rmsprop_centered": (optim.RMSprop, {"lr": 0.01, "centered": True}),
    "adagrad": (optim.Adagrad, {"lr": 0.1}),
    "adamax": (optim.Adamax, {"lr": 0.01}),
    "nadam": (optim.NAdam, {"lr": 0.01}),
    "radam": (optim.RAdam, {"lr": 0.01}),
}
#: optimizers whose state (SGD's momentum buffer) is made by the first step itself: a
#: compiled first step and the later ones are two programs for Dynamo's every backend
#: (``len(state) == 0`` guard), so the run starts after one eager step
STATE_MADE_BY_FIRST_STEP = frozenset({"sgd_momentum", "sgd_nesterov_wd"})

#: max abs difference from eager's parameters after any of the 12 steps (float32; fused
#: kernels round some products once where eager rounds twice, and the other way round)
MAX_ABS_ERROR = 1e-5
#: RAdam once its rectification starts (step > 5): aot_eager and inductor differ from
#: eager by the same 2.4e-5 on these steps (Dynamo's graph computes the rectification
#: term in float32 tensor ops where eager's loop computes it in Python floats)
MAX_ABS_ERROR_OF = {"radam": 3e-5}

SCHEDULERS: dict[str, Callable[[optim.Optimizer], Any]] = {
    "lambda": lambda opt: lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step)),
    "cosine": lambda opt: lr_scheduler.CosineAnnealingLR(opt, T_max=12),
    "onecycle": lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=14,
                                                    cycle_momentum=False),
}


@dataclass
class StepRun:
    """What :func:`run_steps` saw: the largest difference from eager after any step (and
    after each step), and the learning rates used."""

    max_abs_error: float
    errors: list[float]
    lrs: list[float]


def _pair(name: str, foreach: bool, tensor_lr: bool, size: int = 8
          ) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter], Any, Any]:
    cls, options = OPTIMIZERS[name]
    options = dict(options, foreach=foreach)
    if tensor_lr:
        options["lr"] = torch.tensor(options["lr"])
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(size, size)) for _ in range(3)]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in params]
    return params, reference, cls(params, **options), cls(reference, **options)


def _set_grads(params: list, reference: list) -> None:
    for p, r in zip(params, reference):
        grad = torch.randn_like(p)
        p.grad, r.grad = grad.clone(), grad.clone()


def run_steps(name: str, backend: Any, scheduler: str = "lambda", steps: int = 12,
              foreach: bool = False, tensor_lr: bool = False,
              options: dict[str, Any] | None = None) -> StepRun:
    """``steps`` compiled steps of optimizer ``name`` (with ``scheduler`` changing lr every
    step) against eager's, on the same gradients. ``backend``: a torch.compile backend."""
    params, reference, opt, eager_opt = _pair(name, foreach, tensor_lr)
    if name in STATE_MADE_BY_FIRST_STEP:
        _set_grads(params, reference)
        opt.step()
        eager_opt.step()
    sched, eager_sched = SCHEDULERS[scheduler](opt), SCHEDULERS[scheduler](eager_opt)
    kwargs = {"options": options} if options is not None else {}
    step = torch.compile(opt.step, backend=backend, **kwargs)
    errors, lrs = [], []
    for _ in range(steps):
        _set_grads(params, reference)
        lrs.append(float(opt.param_groups[0]["lr"]))
        step()
        eager_opt.step()
        sched.step()
        eager_sched.step()
        errors.append(max(float((p - r).detach().abs().max()) for p, r in zip(params, reference)))
    return StepRun(max(errors), errors, lrs)


def unique_graphs() -> int:
    """Graphs Dynamo compiled since the last reset (1: no recompile)."""
    return counters["stats"]["unique_graphs"]

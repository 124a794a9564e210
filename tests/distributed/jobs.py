"""Functions the distributed tests run on every rank (module level: spawned processes
import them)."""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from simaccel.distributed import shutdown
from simaccel.examples.ddp_demo import rank_job
from simaccel.examples.ddp_train import RunSpec, training_job
from simaccel.runtime.device import get_device


def train_then_shutdown(rank: int, world_size: int, steps: int,
                        specs: list[RunSpec]) -> dict[str, Any]:
    """The demo's rank job (the 5-bucket MLP with a compiled optimizer step, and eager DDP
    on the same batches), every run of ``specs``, then :func:`shutdown`; with the device
    memory left after."""
    demo = rank_job(rank, world_size, steps)
    runs = training_job(rank, world_size, specs)
    shutdown()
    stats = get_device().memory_stats()
    return {"demo": demo, "runs": runs,
            "allocated_after_shutdown": stats["allocated_bytes.all.current"],
            "reserved_after_shutdown": stats["reserved_bytes.all.current"]}


def rank_one_fails_in_a_compiled_step(rank: int, world_size: int) -> None:
    """Rank 1's compiled step raises (an op with no device kernel under
    ``fallback="error"``); rank 0 goes on into a collective rank 1 never reaches."""
    step = torch.compile(lambda x: torch.special.gammainc(x, x) + 1, backend="simaccel",
                         options={"fallback": "error"})
    if rank == 1:
        step(torch.rand(8) + 0.5)
    dist.all_reduce(torch.ones(1))


def every_rank_hangs(rank: int, world_size: int) -> None:
    time.sleep(600)

"""``simaccel demo --ddp``: data-parallel training on 2 ranks, each with its own
simulated device.

Spawns 2 gloo ranks on 127.0.0.1 (or, under ``torchrun --nproc-per-node 2 -m simaccel.cli
demo --ddp``, runs as the rank torchrun started). Each rank trains the 5-bucket MLP of
:mod:`simaccel.examples.ddp_train` with ``DDP(torch.compile(model, backend="simaccel"))``
and a compiled optimizer step whose lr a LambdaLR changes every step, then eager DDP on
the same batches as the reference; prints per-rank figures and writes the merged trace
(a process per rank).
"""
from __future__ import annotations

import json
import os
import statistics
from typing import Any

import torch

#: steps each rank trains
DDP_DEMO_STEPS = 10


def rank_job(rank: int, world_size: int, steps: int) -> dict[str, Any]:
    """One rank's part: the simaccel run, the eager-DDP reference, this device's trace."""
    import simaccel
    from simaccel.examples.ddp_train import RunSpec, train_on_rank
    ours = train_on_rank(rank, RunSpec("mlp", "simaccel", steps, compile_optimizer=True))
    device = simaccel.get_device()
    trace = device.dma.chrome_trace(**device.trace_process())
    reference = train_on_rank(rank, RunSpec("mlp", "none", steps))
    same = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5)
               for a, b in zip(ours.params, reference.params))
    return {"rank": rank, "run": ours, "equal_to_eager_ddp": same, "trace": trace,
            "reference": reference}


def run_ddp_demo(trace_path: str, steps: int = DDP_DEMO_STEPS) -> int:
    """Print the demo; 0 if every rank's parameters equal eager DDP's and the ranks agree."""
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if os.environ.get("RANK", "0") == "0":  # once, not once per torchrun rank
        print(f"simaccel demo --ddp: {os.environ.get('WORLD_SIZE', 2)} ranks (gloo), each "
              f"with its own simulated device, train DDP(torch.compile(mlp, "
              f"backend='simaccel')) for {steps} steps; 5 gradient buckets, lr changed every "
              f"step by LambdaLR\n", flush=True)
    if under_torchrun:
        return _as_torchrun_rank(trace_path, steps)
    from simaccel.distributed import spawn
    return report_job(spawn(rank_job, 2, (steps,)), trace_path)


def report_job(results: list[dict[str, Any]], trace_path: str) -> int:
    """Print what every rank's :func:`rank_job` returned and write the merged trace; 0 if
    every rank's parameters equal eager DDP's and the ranks agree."""
    from simaccel.distributed import merge_traces
    for result in results:
        _print_rank(result)
    with open(trace_path, "w", encoding="utf-8") as fh:
        json.dump(merge_traces([r["trace"] for r in results]), fh)
    print(f"\ntrace of both devices (a process per rank) written to {trace_path}")
    agree = all(torch.equal(a, b) for a, b in zip(results[0]["run"].params,
                                                    results[1]["run"].params))
    print(f"ranks end with identical parameters: {agree}")
    return 0 if agree and all(r["equal_to_eager_ddp"] for r in results) else 1


def _as_torchrun_rank(trace_path: str, steps: int) -> int:
    from simaccel.distributed import init_from_env, shutdown
    rank = init_from_env()
    try:
        result = rank_job(rank, int(os.environ["WORLD_SIZE"]), steps)
    finally:
        shutdown()
    _print_rank(result)
    path = f"{os.path.splitext(trace_path)[0]}.rank{rank}.json"
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(result["trace"], fh)
    print(f"rank {rank}: trace written to {path}")
    return 0 if result["equal_to_eager_ddp"] else 1


def _print_rank(result: dict[str, Any]) -> None:
    run = result["run"]
    dev = run.device
    steps = len(run.step_s)
    median_ms = statistics.median(run.step_s[2:] or run.step_s) * 1e3  # after the compiles
    print(f"rank {result['rank']}: loss {run.losses[0]:.4f} -> {run.losses[-1]:.4f} "
          f"(eager DDP {result['reference'].losses[-1]:.4f}); parameters equal eager DDP: "
          f"{result['equal_to_eager_ddp']}")
    print(f"  graphs compiled {run.unique_graphs[-1]} (after step 1: {run.unique_graphs[0]}), "
          f"kernels launched {dev['kernel_launches']}, host fallback ops "
          f"{dev['host_fallback_ops']}, step {median_ms:.1f} ms (median)")
    print(f"  gradient buckets off and back onto the device: "
          f"{dev['collective.d2h.bytes'] / steps / 1e6:.2f} MB per step "
          f"({dev['collective.d2h.transfers']} transfers each way), "
          f"{100 * run.overlap['hidden_fraction']:.1f}% of their simulated time under "
          f"backward kernels", flush=True)

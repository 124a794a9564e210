"""DistributedDataParallel with simaccel on every rank: 2 gloo ranks on 127.0.0.1.

One job runs every training case on both ranks (each rank is a process with its own
simulated device; the processes start once, ~5 s): ``simaccel demo --ddp``'s rank job (an
MLP with 5 gradient buckets, a compiled optimizer step, eager DDP as the reference), a
transformer block against eager DDP, and Dynamo's ``eager`` backend for graph counts. Then the fault cases: a rank failing inside a compiled step, and a job past
its deadline.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from simaccel.distributed import spawn
from simaccel.errors import DistributedError
from tests.distributed import jobs, prefetch
from tests.distributed.prefetch import SPECS, STEPS

#: float32 losses and parameters: the device's kernels sum in another order than ATen's
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> list[dict]:
    """The job's results, made once per test session: started in the background when the
    session starts (:mod:`tests.distributed.prefetch`); else the first xdist worker
    running tests of this module runs it holding a lock, and the other loads its file."""
    started = prefetch.wait_for()
    if started is not None:
        return started
    base = tmp_path_factory.getbasetemp()  # under xdist: <session folder>/popen-gwN
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with _session_lock(shared / "ddp_job.lock"):
        path = shared / "ddp_job.pkl"
        if path.exists():
            return pickle.loads(path.read_bytes())
        result = prefetch.run_job()
        path.write_bytes(pickle.dumps(result))
        return result


@contextlib.contextmanager
def _session_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _runs(job: list[dict], rank: int) -> dict:
    demo = job[rank]["demo"]
    return {"mlp/simaccel": demo["run"], "mlp/eager-ddp": demo["reference"],
            **dict(zip(SPECS, job[rank]["runs"]))}


@pytest.mark.parametrize("model", ["mlp", "transformer"])
@pytest.mark.parametrize("rank", [0, 1])
def test_losses_and_parameters_equal_eager_ddp(job, model: str, rank: int) -> None:
    runs = _runs(job, rank)
    ours, reference = runs[f"{model}/simaccel"], runs[f"{model}/eager-ddp"]
    torch.testing.assert_close(torch.tensor(ours.losses), torch.tensor(reference.losses),
                               **TOLERANCE)
    assert len(ours.params) == len(reference.params)
    for mine, theirs in zip(ours.params, reference.params):
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype == torch.float32
        torch.testing.assert_close(mine, theirs, **TOLERANCE)


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_every_rank_ends_with_the_same_parameters(job, model: str) -> None:
    first, second = (_runs(job, r)[f"{model}/simaccel"] for r in (0, 1))
    assert first.losses != second.losses  # each rank trained on its own batches
    for a, b in zip(first.params, second.params):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("model", ["mlp", "transformer"])
@pytest.mark.parametrize("rank", [0, 1])
def test_graph_count_and_device_path(job, model: str, rank: int) -> None:
    runs = _runs(job, rank)
    ours, dynamo = runs[f"{model}/simaccel"], runs[f"{model}/dynamo-eager"]
    assert ours.unique_graphs[-1] <= dynamo.unique_graphs[-1]
    assert ours.device["kernel_launches"] > 0
    assert ours.device["host_fallback_ops"] == 0
    assert ours.device["rank"] == rank


@pytest.mark.parametrize("rank", [0, 1])
def test_a_new_lr_every_step_never_recompiles(job, rank: int) -> None:
    """The scheduler changes lr every step. The model compiles at step 1 and the optimizer
    step at step 2 (step 1 runs eagerly: it creates the momentum buffers); simaccel lifts
    lr there and compiles nothing after, while Dynamo's eager backend compiles the step
    again once lr changed (then makes it dynamic)."""
    ours = _runs(job, rank)["mlp/simaccel"]
    dynamo = _runs(job, rank)["mlp/dynamo-eager"]
    assert len(set(ours.lrs)) == STEPS
    assert ours.unique_graphs[0] == 1 and set(ours.unique_graphs[1:]) == {2}
    assert ours.unique_graphs[-1] < dynamo.unique_graphs[-1]


@pytest.mark.parametrize("rank", [0, 1])
def test_buckets_split_the_graph_and_move_through_the_dma_engine(job, rank: int) -> None:
    ours = _runs(job, rank)["mlp/simaccel"]
    splits = {note.split(";")[0] for note in (r.split(": ", 1)[1] for r in ours.reports)
              if note.startswith("DDPOptimizer split")}
    assert len(splits) >= 3
    assert all("through the simaccel DMA engine" in r for r in ours.reports[:2 * len(splits)])
    gradient_bytes = ours.grad_bytes * STEPS
    assert ours.device["collective.d2h.bytes"] == gradient_bytes
    assert ours.device["collective.h2d.bytes"] == gradient_bytes
    # one transfer per bucket and step each way (DDP rebuilds its buckets after step 1)
    assert ours.device["collective.d2h.transfers"] == ours.device["collective.h2d.transfers"]
    assert ours.device["collective.d2h.transfers"] >= 2 * STEPS
    assert 0.0 <= ours.overlap["hidden_fraction"] <= 1.0
    assert ours.overlap["collective_ns"] > 0


@pytest.mark.parametrize("rank", [0, 1])
def test_compiling_the_ddp_module_itself(job, rank: int) -> None:
    """``torch.compile(DDP(model))``: Dynamo 2.13 captures no graph of it in the default
    ``optimize_ddp`` mode (DDP's forward is not traced), for simaccel as for its eager
    backend; with the module attached by hand the buckets still use the DMA engine."""
    runs = _runs(job, rank)
    ours, dynamo = runs["mlp/simaccel-outside"], runs["mlp/dynamo-eager-outside"]
    assert ours.unique_graphs == dynamo.unique_graphs
    torch.testing.assert_close(torch.tensor(ours.losses),
                               torch.tensor(runs["mlp/eager-ddp"].losses[:3]), **TOLERANCE)
    assert ours.device["collective.d2h.bytes"] == ours.grad_bytes * 3


def test_shutdown_frees_the_device_memory(job) -> None:
    for rank in (0, 1):
        assert job[rank]["allocated_after_shutdown"] == 0
        assert job[rank]["reserved_after_shutdown"] == 0


def test_a_failing_rank_ends_the_job_with_its_error() -> None:
    start = time.monotonic()
    with pytest.raises(DistributedError) as info:
        spawn(jobs.rank_one_fails_in_a_compiled_step, 2, timeout_s=120)
    assert time.monotonic() - start < 120
    message = str(info.value)
    assert "rank 1 of the distributed job failed" in message
    assert "UnsupportedOpError" in message and "igamma" in message


def test_a_job_past_its_timeout_is_terminated() -> None:
    start = time.monotonic()
    with pytest.raises(DistributedError, match="ran past its 6 s timeout"):
        spawn(jobs.every_rank_hangs, 2, timeout_s=6)
    assert time.monotonic() - start < 6 + 20


def test_ddp_demo_prints_each_rank_and_writes_one_trace(job, tmp_path, capsys) -> None:
    """``simaccel demo --ddp``'s report of its ranks' jobs (the job above ran them)."""
    import json

    from simaccel.examples.ddp_demo import report_job
    trace = tmp_path / "ddp.json"
    assert report_job([job[rank]["demo"] for rank in (0, 1)], str(trace)) == 0
    out = capsys.readouterr().out
    for rank in (0, 1):
        assert f"rank {rank}: loss" in out
    assert "parameters equal eager DDP: True" in out
    assert "ranks end with identical parameters: True" in out
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {"simaccel device (rank 0)", "simaccel device (rank 1)"}
    assert any(e.get("cat") == "collective.d2h" and e["pid"] == 2 for e in events)


def test_demo_command_line_takes_ddp() -> None:
    from simaccel.cli import build_parser
    args = build_parser().parse_args(["demo", "--ddp", "--steps", "3"])
    assert args.ddp and args.steps == 3 and args.trace is None


def test_torchrun_runs_the_demo_as_its_ranks(job, tmp_path) -> None:
    """``torchrun --nproc-per-node 2 -m simaccel.cli demo --ddp``: each process is one of
    torchrun's ranks (after the job: its kernels are in the shared cache)."""
    import subprocess
    import sys

    from simaccel.distributed import free_port
    trace = tmp_path / "ddp.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), "-m", "simaccel.cli", "demo", "--ddp",
         "--steps", "3", "--trace", str(trace)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("parameters equal eager DDP: True") == 2
    assert proc.stdout.count("simaccel demo --ddp: 2 ranks") == 1
    for rank in (0, 1):
        assert (tmp_path / f"ddp.rank{rank}.json").exists()

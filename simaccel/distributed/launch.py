"""Running a function on every rank of a local data-parallel job (gloo on 127.0.0.1).

:func:`spawn` is ``torch.multiprocessing.spawn`` with what a job on simulated devices
needs around it: a free port, the process group created before and destroyed after the
function (:func:`shutdown`, which also frees the rank's device memory), every rank's return
value, and a deadline. A rank that raises ends the job with that rank's error
(:class:`~simaccel.errors.DistributedError`); a job past its deadline is terminated and
raises too, naming the ranks still running. Under ``torchrun`` (``RANK``/``WORLD_SIZE``
set) :func:`init_from_env` does the per-rank part.
"""
from __future__ import annotations

import datetime
import gc
import os
import pickle
import socket
import tempfile
import time
import traceback
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp

from simaccel.errors import DistributedError
from simaccel.runtime.device import get_device

#: seconds a job may run by default before it is terminated
DEFAULT_TIMEOUT_S = 300.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_from_env(timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Join the gloo process group the environment describes (``torchrun``'s ``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); returns this process's rank, which
    the device's stats and trace carry from now on."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    get_device().rank = rank
    return rank


def shutdown() -> None:
    """Destroy the process group and free this rank's device memory: Dynamo's compiled
    code is dropped (``torch.compiler.reset()``), and every program still alive (autograd
    may keep a training graph's backward) gives back its workspace, constants and resident
    parameters (it would upload them again if called); the allocator's cache is emptied and
    the device forgets its rank."""
    import torch.compiler
    if dist.is_initialized():
        dist.destroy_process_group()
    torch.compiler.reset()
    gc.collect()
    device = get_device()
    device.unload_programs()
    device.rank = None


def _rank_main(rank: int, fn: Callable[..., Any], world_size: int, port: int,
               timeout_s: float, args: tuple, results: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    init_from_env(timeout_s)
    try:
        value = fn(rank, world_size, *args)
    except BaseException:
        # when it failed, for the parent: the other ranks fail too, later, in the
        # collective this rank never reached, and the first failure is the cause
        with open(os.path.join(results, f"rank{rank}.error"), "w", encoding="utf-8") as fh:
            fh.write(f"{time.time()!r}\n{traceback.format_exc()}")
        raise
    finally:
        shutdown()
    # a file, not a queue: a rank's results may be large, and a pipe nobody reads yet
    # (the parent waits for the ranks to exit) would block the rank
    with open(os.path.join(results, f"rank{rank}.pkl"), "wb") as fh:
        pickle.dump(value, fh)


def spawn(fn: Callable[..., Any], world_size: int = 2, args: tuple = (),
          timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes joined in a gloo
    group; returns each rank's return value (picklable), by rank. ``fn`` must be
    importable (a module-level function). Raises :class:`DistributedError` if a rank
    fails or the job runs past ``timeout_s`` seconds."""
    with tempfile.TemporaryDirectory(prefix="simaccel-ranks-") as results:
        _run(fn, world_size, args, timeout_s, results)
        return [_result(results, rank) for rank in range(world_size)]


def _run(fn: Callable[..., Any], world_size: int, args: tuple, timeout_s: float,
         results: str) -> None:
    context = mp.start_processes(
        _rank_main, args=(fn, world_size, free_port(), timeout_s, args, results),
        nprocs=world_size, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=max(deadline - time.monotonic(), 0.0)):
            if time.monotonic() >= deadline:
                _terminate(context)
                running = [r for r, p in enumerate(context.processes) if p.exitcode is None]
                raise DistributedError(
                    f"the distributed job ran past its {timeout_s:.0f} s timeout; ranks "
                    f"{running} were still running and have been terminated. Raise "
                    f"timeout_s if the job needs longer, or look for a rank stuck in a "
                    f"collective the others never reached")
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        rank, error = _first_failure(results, exc)
        raise DistributedError(
            f"rank {rank} of the distributed job failed; the other ranks were stopped. "
            f"Its error:\n{error}") from exc


def _first_failure(folder: str, exc: Exception) -> tuple[int, str]:
    """The rank that raised first and its traceback (from the ranks' error files), else
    the rank torch reports (a rank killed by a signal writes no file)."""
    failures = []
    for name in os.listdir(folder):
        if name.endswith(".error"):
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                when, _, text = fh.read().partition("\n")
            failures.append((float(when), int(name[4:-6]), text.strip()))
    if not failures:
        return exc.error_index, str(exc).strip()
    _, rank, text = min(failures)
    return rank, text


def _result(folder: str, rank: int) -> Any:
    with open(os.path.join(folder, f"rank{rank}.pkl"), "rb") as fh:
        return pickle.load(fh)


def _terminate(context: Any) -> None:
    for process in context.processes:
        if process.is_alive():
            process.terminate()
    for process in context.processes:
        process.join(5)
        if process.is_alive():
            process.kill()

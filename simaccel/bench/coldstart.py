"""First call of the compile workload in a new process: ``python -m simaccel.bench.coldstart
BACKEND`` prints one JSON line ``{"first_call_s": ..., "graphs": ..., ...}`` (for simaccel
also ``compiled_s``: until its background kernel compiles are done).

The parent points ``SIMACCEL_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` at a folder of its
choice: empty for a cold compile, the cold run's folder again for a warm one. Options:
``--lift auto|off``, ``--workload NAME``, ``--layers N`` (the GPT-2 decoder's depth),
``--save PATH`` (write ``torch.compiler.save_cache_artifacts()`` after the call) and
``--load PATH`` (load such artifacts before compiling: torch's Mega-Cache).
"""
from __future__ import annotations

import compileall
import functools
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

#: seconds a cold inductor compile may take on a loaded 2-core machine before we give up.
TIMEOUT_S = 900


@functools.cache
def compile_package_bytecode() -> None:
    """Byte-compile simaccel's modules beside their sources, once per process, before a
    child process is timed: installing a wheel does this, and torch's modules come with
    theirs. Without it, an environment with ``PYTHONDONTWRITEBYTECODE`` set (or an
    editable install never imported yet) compiles ~40 simaccel modules from source inside
    every child's first call (~50 ms), a cost no compile cache the run empties would
    explain. Unwritable package folders are left as they are."""
    compileall.compile_dir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           quiet=2)


def cache_env(cache_root: str) -> dict[str, str]:
    """The environment of a child whose caches all live under ``cache_root``; its kernels
    start in tier 0 as by default (the bench's own process turns tier 0 off)."""
    return {**os.environ,
            "SIMACCEL_CACHE_DIR": os.path.join(cache_root, "simaccel"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_root, "inductor"),
            "SIMACCEL_TIER0": "1"}


#: workloads a child can compile: the MLP (default without ``--lift``), the scaled MLP
#: (default with it), the config-object model and the GPT-2-style decoder
WORKLOADS = ("mlp3", "scaled_mlp", "config_model", "gpt2")


def first_call_in_new_process(backend: str, cache_root: str, lift: str | None = None,
                              workload: str | None = None, **options: Any) -> dict[str, Any]:
    """Run :func:`main` in a child process; returns its JSON plus ``process_s`` (seconds
    from spawn to exit, interpreter and torch import included). ``lift`` ("auto"/"off",
    simaccel only) compiles with that lift option; ``workload`` is one of
    :data:`WORKLOADS` (default: the MLP, or with ``lift`` the scaled MLP); ``options``:
    ``layers``, ``save``, ``load`` (see the module doc)."""
    compile_package_bytecode()
    start = time.perf_counter()
    extra = [] if lift is None else ["--lift", lift]
    extra += [] if workload is None else ["--workload", workload]
    for name, value in options.items():
        if value is not None:
            extra += [f"--{name}", str(value)]
    proc = subprocess.run([sys.executable, "-m", "simaccel.bench.coldstart", backend, *extra],
                          env=cache_env(cache_root), text=True, capture_output=True,
                          timeout=TIMEOUT_S)
    process_s = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"compile process for {backend} failed:\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = process_s
    return result


def _workload(lift: str | None, workload: str | None, layers: int | None = None
              ) -> tuple[Any, tuple, Any]:
    """``(model, args, options)`` of the run."""
    import torch

    from simaccel.bench.configmodel import config_model
    from simaccel.bench.gpt2 import gpt2
    from simaccel.bench.workloads import mlp3, scaled_mlp

    torch.manual_seed(0)
    name = workload or ("mlp3" if lift is None else "scaled_mlp")
    options = None if lift is None else {"lift": lift}
    if name == "config_model":
        return (*config_model(), options)
    if name == "gpt2":
        return (*gpt2(n_layer=layers or 6), options)
    if name == "scaled_mlp":
        return scaled_mlp(), (torch.randn(64, 256), 0.5, 3), options
    if name == "mlp3":
        return mlp3(), (torch.randn(64, 256),), options
    raise ValueError(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)}")


def main(backend: str, lift: str | None = None, workload: str | None = None,
         layers: int | None = None, save: str | None = None,
         load: str | None = None) -> dict[str, Any]:
    """Import, build the workload, then time its first compiled call (seconds; loading
    Mega-Cache artifacts from ``load`` is timed with it). simaccel's counters are read
    after its background compiles finished (the process waits for them at exit anyway)."""
    import torch
    from torch._dynamo.utils import counters

    from simaccel.bench.measure import compile_for

    model, args, options = _workload(lift, workload, layers)
    # Every run starts from a collected heap: importing torch leaves a full collection
    # due (~150 ms over its objects), which otherwise lands in whichever first call
    # allocates past the threshold, not in the compile that caused it. A collection
    # the call itself causes still counts, and is reported (gc_s).
    gc.collect()
    collecting = GcTimer()
    start = time.perf_counter()
    if load is not None:
        with open(load, "rb") as fh:
            torch.compiler.load_cache_artifacts(fh.read())
    with torch.no_grad():
        compile_for(model, backend, dynamic=False, options=options)(*args)
    result: dict[str, Any] = {"first_call_s": time.perf_counter() - start,
                              "graphs": int(counters["stats"]["unique_graphs"]),
                              "gc_s": collecting.stop()}
    if backend == "simaccel":
        import simaccel
        simaccel.wait_for_kernels()
        # until every kernel runs compiled: the first call, then its background numba
        # compiles (what the kernel cache saves a warm process; tier 0 hides it from
        # the first call)
        result["compiled_s"] = time.perf_counter() - start
    if save is not None:  # waits for simaccel's background compiles first
        saved = torch.compiler.save_cache_artifacts()
        with open(save, "wb") as fh:
            fh.write(saved[0] if saved else b"")
    if backend == "simaccel":
        stats = simaccel.get_device().runtime_stats()
        result["kernels_compiled"] = stats["kernels_compiled"]
        result["kernel_cache_hits"] = stats["kernel_cache_hits"]
        result["tier0_kernels"] = stats.get("tier0_kernels", 0)
        result["lifted"] = sum(len(r.guards.lifted_sources) for r in simaccel.reports())
        result["phases_s"] = simaccel.compile_times()
    return result


class GcTimer:
    """Seconds the garbage collector ran from construction to :meth:`stop`."""

    def __init__(self) -> None:
        self.spent = 0.0
        self._began = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.spent += time.perf_counter() - self._began

    def stop(self) -> float:
        gc.callbacks.remove(self._on_gc)
        return self.spent


def _flag(args: list[str], name: str) -> str | None:
    """The value after ``name`` in ``args``, if given."""
    return args[args.index(name) + 1] if name in args[:-1] else None


if __name__ == "__main__":
    _layers = _flag(sys.argv, "--layers")
    print(json.dumps(main(sys.argv[1], _flag(sys.argv, "--lift"), _flag(sys.argv, "--workload"),
                          int(_layers) if _layers else None, _flag(sys.argv, "--save"),
                          _flag(sys.argv, "--load"))))

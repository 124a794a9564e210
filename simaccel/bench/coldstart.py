"""First call of the compile workload in a new process: ``python -m simaccel.bench.coldstart
BACKEND`` prints one JSON line ``{"first_call_s": ..., "graphs": ..., ...}``.

The parent points ``SIMACCEL_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` at a folder of its
choice: empty for a cold compile, the cold run's folder again for a warm one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

#: seconds a cold inductor compile may take on a loaded 2-core machine before we give up.
TIMEOUT_S = 900


def cache_env(cache_root: str) -> dict[str, str]:
    """The environment of a child whose caches all live under ``cache_root``."""
    return {**os.environ,
            "SIMACCEL_CACHE_DIR": os.path.join(cache_root, "simaccel"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_root, "inductor")}


def first_call_in_new_process(backend: str, cache_root: str,
                              lift: str | None = None) -> dict[str, Any]:
    """Run :func:`main` in a child process; returns its JSON plus ``process_s`` (seconds
    from spawn to exit, interpreter and torch import included). ``lift`` ("auto"/"off",
    simaccel only): compile the scalar workload with that lift option instead of the MLP."""
    start = time.perf_counter()
    extra = [] if lift is None else ["--lift", lift]
    proc = subprocess.run([sys.executable, "-m", "simaccel.bench.coldstart", backend, *extra],
                          env=cache_env(cache_root), text=True, capture_output=True,
                          timeout=TIMEOUT_S)
    process_s = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"compile process for {backend} failed:\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = process_s
    return result


def main(backend: str, lift: str | None = None) -> dict[str, Any]:
    """Import, build the workload, then time its first compiled call (seconds)."""
    import torch
    from torch._dynamo.utils import counters

    from simaccel.bench.measure import compile_for
    from simaccel.bench.workloads import mlp3, scaled_mlp

    torch.manual_seed(0)
    if lift is None:
        model, args, options = mlp3(), (torch.randn(64, 256),), None
    else:
        model, args, options = scaled_mlp(), (torch.randn(64, 256), 0.5, 3), {"lift": lift}
    start = time.perf_counter()
    with torch.no_grad():
        compile_for(model, backend, dynamic=False, options=options)(*args)
    result: dict[str, Any] = {"first_call_s": time.perf_counter() - start,
                              "graphs": int(counters["stats"]["unique_graphs"])}
    if backend == "simaccel":
        import simaccel
        result["kernel_cache_hits"] = simaccel.get_device().runtime_stats()["kernel_cache_hits"]
    return result


if __name__ == "__main__":
    lift_arg = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--lift" else None
    print(json.dumps(main(sys.argv[1], lift_arg)))

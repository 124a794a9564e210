"""Cold compile (fresh process, empty caches) of a 3-layer MLP, simaccel against inductor.

Target (issue 2): simaccel's cold compile at most 1/5 of inductor's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

SCRIPT = """
import json, sys, time, torch
from bench.workloads import mlp3
backend = sys.argv[1]
model, x = mlp3(), torch.randn(64, 256)
start = time.perf_counter()
with torch.no_grad():
    torch.compile(model, backend=backend, dynamic=False)(x)
print(json.dumps({"first_call_s": time.perf_counter() - start}))
"""


def cold_first_call(backend: str) -> float:
    """Seconds of the first call (trace + compile + run) in a new process, empty caches."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "SIMACCEL_CACHE_DIR": os.path.join(cache, "simaccel"),
               "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor"),
               "TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}
        proc = subprocess.run([sys.executable, "-c", SCRIPT, backend], env=env, text=True,
                              capture_output=True, timeout=600,
                              cwd=os.path.dirname(os.path.dirname(__file__)))
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])["first_call_s"]


@pytest.mark.parametrize("backend", ["inductor", "simaccel"])
def test_cold_compile_mlp3(benchmark, backend):
    benchmark.group = "cold_compile_mlp3"
    benchmark.extra_info["backend"] = backend
    seconds = benchmark.pedantic(cold_first_call, args=(backend,), rounds=1, iterations=1)
    benchmark.extra_info["first_call_s"] = seconds

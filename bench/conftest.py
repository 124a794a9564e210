"""Benchmark session setup and the ratio table printed at the end.

* Caches: ``SIMACCEL_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR`` and ``NUMBA_CACHE_DIR`` point
  at fresh temporary folders unless the caller set them.
* ``SIMACCEL_BENCH_QUICK=1``: tiny kernel sizes and compile-time runs for simaccel only;
  with ``--benchmark-disable -k "not inductor"`` the whole suite is a ~1 minute smoke test.
* ``SIMACCEL_BENCH_THREADS=N``: torch and numba compute threads (default: their own).
* ``SIMACCEL_TIER0=0`` in this process: timed calls run compiled kernels only; the first
  calls in new processes start in tier 0 as a user's do (``coldstart.cache_env``).
* Every benchmark sets ``extra_info["backend"]``; the table compares each backend with the
  baseline of its group measured in the same run (see :func:`baseline_of`).
"""
from __future__ import annotations

import os
import pathlib
import sys
import tempfile

import pytest

_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

def pytest_configure(config: pytest.Config) -> None:
    # NUMBA_CACHE_DIR: numba would otherwise cache the kernel helper library's machine code
    # in the checkout (next to simaccel/codegen/kernel_lib.py); numba reads it at import.
    for var in ("SIMACCEL_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "NUMBA_CACHE_DIR"):
        os.environ.setdefault(var, tempfile.mkdtemp(prefix=f"simaccel-bench-{var[:8].lower()}-"))
    os.environ["SIMACCEL_TIER0"] = "0"
    threads = os.environ.get("SIMACCEL_BENCH_THREADS")
    if threads:
        import numba
        import torch
        torch.set_num_threads(int(threads))
        numba.set_num_threads(min(int(threads), numba.config.NUMBA_NUM_THREADS))


def baseline_of(group: str) -> str:
    """The backend each benchmark group is compared with."""
    if group.startswith("compile_cold"):
        return "inductor"
    if group.startswith(("steady", "guard")):
        return "dynamo_eager"
    return "eager"


def _figure(bench) -> float:
    """The seconds a benchmark stands for: ``extra_info["seconds"]`` if it set one (e.g.
    the first call inside a child process), else its median."""
    return bench.extra_info.get("seconds", bench.stats.median)


def _groups(session) -> dict[str, dict[str, object]]:
    groups: dict[str, dict[str, object]] = {}
    for bench in session.benchmarks:
        backend = bench.extra_info.get("backend")
        if backend and bench.stats and bench.stats.rounds:
            groups.setdefault(bench.group or bench.name, {})[backend] = bench
    return groups


def _cell(backend: str, bench, base) -> str:
    seconds = _figure(bench)
    text = f"{backend} {seconds * 1e3:.3f} ms"
    if base is not None and _figure(base):
        text += f" ({seconds / _figure(base):.2f}x)"
    info = bench.extra_info
    if "recompiles" in info:
        text += f" [recompiles {info['recompiles']}"
        if info.get("steady_median_s"):
            text += f", /steady {seconds / info['steady_median_s']:.2f}x"
        text += "]"
    if info.get("guard_check_s"):
        text += f" [guard check {info['guard_check_s'] * 1e6:.2f} us]"
    return text


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    session = getattr(config, "_benchmarksession", None)
    if session is None or not session.benchmarks:
        return
    groups = _groups(session)
    if not groups:
        return
    tr = terminalreporter
    tr.section("simaccel: each backend against its group's baseline in this run")
    tr.write_line("baselines: compile_cold -> inductor; steady, guard -> dynamo_eager; "
                  "others -> eager (plain PyTorch); compile_warm -> compare with compile_cold")
    for group, benches in sorted(groups.items()):
        base = benches.get(baseline_of(group))
        cells = [_cell(b, bench, base) for b, bench in sorted(benches.items())]
        tr.write_line(f"{group} (vs {baseline_of(group)}): " + "; ".join(cells))

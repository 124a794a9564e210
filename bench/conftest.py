"""Benchmark session setup: a fresh kernel cache, and a ratio table (each backend against
plain eager measured in the same run) printed at the end."""
from __future__ import annotations

import os
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("SIMACCEL_CACHE_DIR", tempfile.mkdtemp(prefix="simaccel-bench-cache-"))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    session = getattr(config, "_benchmarksession", None)
    if session is None or not session.benchmarks:
        return
    groups: dict[str, dict[str, float]] = {}
    for bench in session.benchmarks:
        if not bench.stats or not bench.stats.rounds:
            continue
        backend = bench.extra_info.get("backend")
        if backend:
            seconds = bench.extra_info.get("first_call_s", bench.stats.median)
            groups.setdefault(bench.group or bench.name, {})[backend] = seconds
    if not groups:
        return
    tr = terminalreporter
    tr.section("simaccel: median time relative to the baseline in this run")
    for group, times in sorted(groups.items()):
        base_name = "inductor" if "compile" in group else "eager"
        base = times.get(base_name)
        cells = []
        for backend, median in sorted(times.items()):
            ratio = f" ({median / base:.2f}x {base_name})" if base else ""
            cells.append(f"{backend} {median * 1e3:.3f} ms{ratio}")
        tr.write_line(f"{group}: " + "; ".join(cells))

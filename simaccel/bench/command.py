"""``simaccel bench``: run the scenarios, print the table, write JSON and the PNG.

Errors a user can fix (no matplotlib for ``--plot``, a path that cannot be written)
print one line on stderr and return status 2.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence

PROG = "simaccel bench"


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _write_json(data: dict, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")


def load_warning(meta: dict) -> str | None:
    """A warning line when the 1-minute load average exceeded the machine's cores at the
    start or the end of the run (other work shared the cores, so times are inflated and
    noisy), else None."""
    loads = [v for v in (meta.get("load_avg_1m_start"), meta.get("load_avg_1m_end"))
             if v is not None]
    cpus = meta.get("cpus")
    if not loads or not cpus or max(loads) <= cpus:
        return None
    return (f"warning: load average {max(loads)} exceeded the {cpus} cores: other processes "
            f"shared the machine during the run, so absolute times are inflated; compare "
            f"the ratios (each against a baseline measured in the same run), or re-run on a "
            f"quiet machine")


def run_bench_command(quick: bool = False, backends: Sequence[str] | None = None,
                      scenarios: str | None = None, json_path: str | None = None,
                      plot_path: str | None = None, threads: int | None = None) -> int:
    """Run, print the table on stdout (progress on stderr), write the files; exit status."""
    if plot_path is not None:
        from simaccel.bench.plot import PlotUnavailableError, load_pyplot
        try:
            load_pyplot()  # before the run: fail in a second, not after minutes
        except PlotUnavailableError as exc:
            return _error(str(exc))
    from simaccel.bench.report import print_table, to_json
    from simaccel.bench.runner import run_bench

    patterns = [p.strip() for p in scenarios.split(",") if p.strip()] if scenarios else None
    result = run_bench(backends=backends, quick=quick, scenarios=patterns, threads=threads)
    if not result.records:
        return _error(f"no scenario matches --scenarios {scenarios!r}")
    meta = result.meta
    print(f"simaccel bench: {len(result.records)} measurements in {meta['wall_s']:.0f} s, "
          f"torch {meta['torch']}, {meta['cpus']} cpus, {meta['torch_threads']} compute "
          f"threads, load average {meta['load_avg_1m_start']} -> {meta['load_avg_1m_end']}")
    warning = load_warning(meta)
    if warning:
        print(warning)
    print_table(result, sys.stdout)
    try:
        if json_path is not None:
            _write_json(to_json(result), json_path)
            print(f"\nJSON written to {json_path}")
        if plot_path is not None:
            from simaccel.bench.plot import write_plot
            write_plot(result, plot_path)
            print(f"plot written to {plot_path}")
    except OSError as exc:
        return _error(f"cannot write {exc.filename}: {exc.strerror}")
    return 0

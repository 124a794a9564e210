"""The ``--plot`` PNG: changed-scalar call latency per backend and scenario (log scale)
and the steady call time of the tiny graph. Needs matplotlib (the ``bench`` extra)."""
from __future__ import annotations

from typing import Any

from simaccel.bench.runner import BenchResult


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def load_pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend; :class:`PlotUnavailableError` if missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailableError(
            "--plot needs matplotlib: pip install 'simaccel[bench]'") from exc
    return plt


def _bars(ax: Any, labels: list[str], series: dict[str, list[float | None]]) -> None:
    """Grouped bars: one group per label, one bar per series (missing values skipped)."""
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [j + i * width for j, v in enumerate(values) if v]
        ax.bar(xs, [v for v in values if v], width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)


def _scalar_panel(ax: Any, result: BenchResult) -> None:
    keys = list(dict.fromkeys(r.key for r in result.records if r.group == "scalar"))
    series = {}
    for backend in result.backends:
        series[backend] = [(rec.median_s * 1e3 if (rec := result.get(k, backend)) and
                            rec.median_s else None) for k in keys]
    _bars(ax, [k.split("/", 1)[1] for k in keys], series)
    ax.set_yscale("log")
    ax.set_ylabel("ms per call (log)")
    ax.set_title("call after a scalar changed (recompile latency)")
    ax.legend(fontsize=7)


def _steady_panel(ax: Any, result: BenchResult) -> None:
    names, values = [], []
    for backend in result.backends:
        rec = result.get("steady/tiny_x*2+1_16", backend)
        if rec and rec.median_s:
            names.append(backend)
            values.append(rec.median_s * 1e6)
    ax.bar(names, values, color="tab:gray")
    ax.set_ylabel("us per call")
    ax.set_title("steady call, x*2+1 on 16 elements")
    ax.tick_params(axis="x", rotation=30, labelsize=7)


def write_plot(result: BenchResult, path: str) -> None:
    """Write the two-panel PNG to ``path``."""
    plt = load_pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5),
                                      gridspec_kw={"width_ratios": [3, 1]})
    _scalar_panel(left, result)
    _steady_panel(right, result)
    fig.suptitle("simaccel bench" + (" (quick)" if result.meta.get("quick") else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)

"""Steady per-call overhead and guard overhead, every backend in one run.

* tiny graph ``x * 2.0 + 1.0`` on 16 elements (target: simaccel <= 1.5x Dynamo's eager
  backend);
* three scalar arguments: Dynamo's guards with lifting (simaccel default), without
  (``lift="off"``) and with one backend-added guard (``simaccel.Guard``).
"""
from __future__ import annotations

import pytest

from simaccel.bench import BACKENDS
from simaccel.bench import measure
from simaccel.bench.scenarios import GUARD_VARIANTS, guard_options, prepare_guard, prepare_tiny


@pytest.mark.parametrize("backend", BACKENDS)
def test_steady_tiny_graph(benchmark, backend: str) -> None:
    compiled, args = prepare_tiny(backend)
    benchmark.group = "steady_tiny_x*2+1_16"
    benchmark.extra_info["backend"] = backend
    benchmark(compiled, *args)


def _guard_cases() -> list[tuple[str, str]]:
    return [(b, "default") for b in BACKENDS] + [
        ("simaccel", v) for v in GUARD_VARIANTS if v != "default"]


@pytest.mark.parametrize("backend,variant", _guard_cases())
def test_guard_overhead(benchmark, backend: str, variant: str) -> None:
    try:
        guard_options(variant)
    except LookupError as exc:
        pytest.skip(str(exc))
    compiled, args, fn = prepare_guard(backend, variant)
    benchmark.group = "guard_3_scalars"
    # one table row per simaccel variant; the default keeps the plain backend name
    benchmark.extra_info["backend"] = backend if variant == "default" else f"{backend}[{variant}]"
    f_locals = dict(zip(("x", "a", "b", "n"), args))
    benchmark.extra_info["guard_check_s"] = (
        measure.guard_check_seconds(fn, f_locals, calls=200) if backend != "eager" else None)
    benchmark(compiled, *args)

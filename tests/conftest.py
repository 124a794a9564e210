"""Fixtures and helpers shared by the whole test suite.

* Private caches for the session, outside the checkout: ``SIMACCEL_CACHE_DIR`` (kernel
  cache), ``NUMBA_CACHE_DIR`` (numba's machine code, also of the kernel helper library
  next to ``simaccel/codegen/kernel_lib.py``) and Hypothesis' directory point into one
  fresh temporary folder (shared by the xdist workers of the session), so tests never read
  or write the user's caches or files in the checkout, and a run always starts cold, as on
  a fresh install. Child processes the tests start inherit the two variables.
* :func:`check`: compile a function with ``backend="simaccel"``, run it, and assert it
  equals eager and really ran on the device (``check_model`` in Inductor's tests).
"""
from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

_ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


#: set by the process that made the session's cache folder (the xdist controller, or the
#: one pytest process), read by xdist workers, which inherit its environment
_SESSION_ROOT = "SIMACCEL_TESTS_CACHE_ROOT"


def _private_caches() -> tuple[pathlib.Path, bool]:
    """Point the caches at the session's temporary folder; returns it and whether this
    process made it (and removes it at the end). Runs at import of this conftest, before
    anything imports numba (which reads ``NUMBA_CACHE_DIR`` once, at import) or compiles
    a kernel (the kernel cache reads ``SIMACCEL_CACHE_DIR`` at its first compile).

    xdist workers share the controller's folder: a kernel two workers' tests need is
    compiled once (the kernel cache's lock file makes the second wait and load it), as the
    ranks of a job on one machine share it. Hypothesis' example database and caches go
    there too (a folder per worker), not to ``./.hypothesis``."""
    inherited = os.environ.get(_SESSION_ROOT)
    owner = not (inherited and os.environ.get("PYTEST_XDIST_WORKER"))
    root = pathlib.Path(tempfile.mkdtemp(prefix="simaccel-tests-") if owner else inherited)
    os.environ[_SESSION_ROOT] = str(root)
    os.environ["SIMACCEL_CACHE_DIR"] = str(root / "kernels")
    os.environ["NUMBA_CACHE_DIR"] = str(root / "numba")
    # xdist's workers keep both cores busy: compile serially (the compile pool's own
    # tests turn it on)
    os.environ.setdefault("SIMACCEL_COMPILE_WORKERS", "0")
    if "numba" in sys.modules:  # imported by a plugin first: make it read the variable
        sys.modules["numba"].config.reload_config()
    set_hypothesis_home_dir(root / f"hypothesis-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")
    return root, owner


_CACHE_ROOT, _OWN_CACHE_ROOT = _private_caches()


_BACKGROUND: list = []


def pytest_configure(config: pytest.Config) -> None:
    """The session's first process starts the DDP tests' job in the background (see
    :mod:`tests.distributed.prefetch`), so no worker waits idle for it."""
    if _OWN_CACHE_ROOT and not os.environ.get("PYTEST_XDIST_WORKER"):
        from tests.distributed import prefetch
        if prefetch.selected(list(config.args), pathlib.Path(str(config.invocation_params.dir))):
            _BACKGROUND.append(prefetch.start(_CACHE_ROOT))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _BACKGROUND:  # a session that ended early: the job is not needed
        from tests.distributed import prefetch
        for process in _BACKGROUND:
            prefetch.stop(process)
    if _OWN_CACHE_ROOT:
        shutil.rmtree(_CACHE_ROOT, ignore_errors=True)


import torch  # noqa: E402
import torch._dynamo  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch.utils._pytree import keystr, tree_flatten_with_path, tree_map  # noqa: E402

import simaccel  # noqa: E402
from simaccel import get_device  # noqa: E402
from tests.ops.summary_hooks import (  # noqa: E402,F401 - the OpInfo sweep's table
    pytest_runtest_logreport, pytest_terminal_summary,
)

#: float32 pointwise tolerances of the op suite (the issue's contract).
POINTWISE_TOL = {"rtol": 1e-5, "atol": 1e-6}
#: reductions, normalisations, matmul, convolution and attention.
REDUCTION_TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(scope="session")
def kernel_cache_dir() -> pathlib.Path:
    """The session's private kernel cache (``SIMACCEL_CACHE_DIR``, shared by the xdist
    workers), initially empty."""
    return _CACHE_ROOT / "kernels"


@pytest.fixture
def without_fused_attention(monkeypatch):
    """The attention paths of a torch whose library exports no BLAS GEMM: float32 and
    float64 attention otherwise runs as the fused kernel (test_fused_attention), so the
    GEMM-pair decomposition and the flash library call serve masks and bfloat16 only."""
    from simaccel.codegen import templates_attention
    monkeypatch.setattr(templates_attention, "has_gemm", lambda dtype: False)


@dataclass
class CheckResult:
    """What :func:`check` observed: the compiled outputs, device counters, reports."""

    outputs: Any
    runtime_stats: dict[str, int]
    dma_stats: dict[str, Any]
    reports: list[simaccel.CompileReport] = field(default_factory=list)

    @property
    def fallbacks(self) -> list[tuple[str, str]]:
        return [fb for report in self.reports for fb in report.host_fallbacks]


def _clone(value: Any) -> Any:
    """Copy tensors preserving their strides (so eager sees the same layouts).
    Expanded (stride-0) tensors are passed as they are: they cannot be written to."""
    def copy(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or 0 in t.stride():
            return t
        return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype).copy_(t)
    return tree_map(copy, value)


def _mismatches(actual: Any, expected: Any, rtol: float, atol: float) -> list[str]:
    """One message per output leaf that differs from eager (dtype, shape or values)."""
    act_leaves, act_spec = tree_flatten_with_path(actual)
    exp_leaves, exp_spec = tree_flatten_with_path(expected)
    if act_spec != exp_spec:
        return [f"output structure differs: {act_spec} vs eager {exp_spec}"]
    problems = []
    for (path, got), (_, want) in zip(act_leaves, exp_leaves):
        try:
            if isinstance(want, torch.Tensor):
                torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
            else:
                assert got == want, f"{got!r} != {want!r}"
        except AssertionError as exc:
            problems.append(f"output{keystr(path)}: {exc}")
    return problems


def _tensors(value: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten_with_path(value)
    return [leaf for _, leaf in leaves if isinstance(leaf, torch.Tensor)]


def check(fn: Callable[..., Any], *args: Any, rtol: float = POINTWISE_TOL["rtol"],
          atol: float = POINTWISE_TOL["atol"], expect_fallback: bool = False,
          fallback_reason: str | None = None, device_work: bool | None = None,
          graphs: int = 1) -> CheckResult:
    """Compile ``fn`` with simaccel, run it on ``args`` and compare with eager.

    Asserts: every output leaf has eager's dtype, shape and values (``assert_close``
    with ``rtol``/``atol`` and ``equal_nan``); kernels launched and DMA moved bytes when
    the graph has device work (by default: some output has elements); no host
    fallback unless ``expect_fallback``, in which case one happened and, if given,
    ``fallback_reason`` is in the reason of the last report's fallbacks; Dynamo made
    ``graphs`` graphs (1: no graph break, nothing ran in eager between graphs).
    """
    torch._dynamo.reset()
    counters.clear()
    simaccel.clear_reports()
    device = get_device()
    device.reset_stats()
    expected = fn(*_clone(args))
    compiled = torch.compile(fn, backend="simaccel", dynamic=False)
    actual = compiled(*_clone(args))
    reports = simaccel.reports()
    result = CheckResult(actual, device.runtime_stats(), device.dma_stats(), reports)
    assert reports, "simaccel compiled no graph"
    assert counters["stats"]["unique_graphs"] == graphs, \
        f"Dynamo made {counters['stats']['unique_graphs']} graphs, expected {graphs}"
    problems = _mismatches(actual, expected, rtol, atol)
    assert not problems, "compiled result differs from eager:\n" + "\n".join(problems)
    _check_fallbacks(result, expect_fallback, fallback_reason)
    if device_work is None:
        device_work = any(t.numel() for t in _tensors(expected)) and not expect_fallback
    if device_work:
        _check_device_ran(result)
    return result


def _check_fallbacks(result: CheckResult, expect: bool, reason: str | None) -> None:
    ops = result.runtime_stats["host_fallback_ops"]
    if not expect:
        assert ops == 0 and not result.fallbacks, f"unexpected host fallbacks: {result.fallbacks}"
        return
    assert ops > 0, "expected a host fallback, but everything ran on the device"
    if reason is not None:
        last = result.reports[-1].host_fallbacks
        assert any(reason in why for _, why in last), \
            f"no host fallback gives the reason {reason!r}: {last}"


def _check_device_ran(result: CheckResult) -> None:
    stats, dma = result.runtime_stats, result.dma_stats
    assert stats["kernel_launches"] > 0, f"no kernel ran on the device: {stats}"
    moved = dma["h2d.bytes"] + dma["d2h.bytes"] + dma.get("const.bytes", 0)
    assert moved > 0, f"no bytes moved by DMA: {dma}"


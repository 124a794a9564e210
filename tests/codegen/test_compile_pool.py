"""Parallel kernel compiles (:mod:`simaccel.codegen.compile_pool`): kernels a graph misses
compile in forked worker processes that write the cache; this process loads what they
wrote. The files are the ones a serial compile writes, a graph compiled this way equals
eager and counts its kernels as compiled, and a failing worker job leaves the kernel to
this process (where its error raises as usual)."""
from __future__ import annotations

import concurrent.futures
import logging
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import simaccel
from simaccel.codegen import compile_pool
from simaccel.codegen.cache import KernelCache
from simaccel.errors import KernelCompileError

from tests.conftest import POINTWISE_TOL

F32 = "array(float32, 1d, C)"
SIG = (F32, F32, "int64")


def _source(k: int) -> str:
    return textwrap.dedent(f"""\
        import numba
        import numpy as np


        @numba.njit(cache=True, error_model='numpy')
        def kernel(out, a, n):
            for i in range(n):
                out[i] = np.float32(np.sin(a[i]) * np.float32({k + 0.5}))
        """)


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.glob("sk_*") if p.suffix != ".lock"}


def test_workers_write_what_a_serial_compile_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMACCEL_COMPILE_WORKERS", "2")
    jobs = [(_source(k), SIG) for k in range(3)]
    pooled, serial = tmp_path / "pool", tmp_path / "serial"
    compiled = compile_pool.precompile(KernelCache(pooled).root, jobs)
    assert compiled == {source for source, _ in jobs}
    for source, sig in jobs:
        KernelCache(serial).load(source, sig)
    # the same files: modules byte for byte; machine code differing only in the symbol
    # suffixes numba numbers per process, so compared by what it computes
    ours, theirs = _files(pooled), _files(serial)
    assert ours.keys() == theirs.keys()
    assert {n: b for n, b in ours.items() if n.endswith(".py")} == \
        {n: b for n, b in theirs.items() if n.endswith(".py")}
    a = np.linspace(-1, 1, 9, dtype=np.float32)
    for k, (source, sig) in enumerate(jobs):
        assert KernelCache(pooled).has(source, sig)
        outs = []
        for root in (pooled, serial):
            loaded = KernelCache(root).load(source, sig)
            assert loaded.origin == "disk"
            outs.append(np.zeros_like(a))
            loaded.fn(outs[-1], a, a.size)
        np.testing.assert_array_equal(outs[0], outs[1])
        np.testing.assert_allclose(outs[0], np.sin(a) * np.float32(k + 0.5), rtol=1e-6)


def test_a_failing_job_is_left_to_this_process(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SIMACCEL_COMPILE_WORKERS", "2")
    broken = _source(0).replace("np.sin(a[i])", "np.sin(a[i], 1, 2, 3)")
    jobs = [(broken, SIG), (_source(1), SIG), (_source(2), SIG)]
    with caplog.at_level(logging.WARNING, logger="simaccel.codegen"):
        compiled = compile_pool.precompile(KernelCache(tmp_path).root, jobs)
    assert compiled == {_source(1), _source(2)}
    assert "compile worker failed" in caplog.text
    with pytest.raises(KernelCompileError):
        KernelCache(tmp_path).load(broken, SIG)


def test_serial_when_asked_or_when_too_few_kernels(tmp_path, monkeypatch):
    jobs = [(_source(k), SIG) for k in range(3)]
    monkeypatch.setenv("SIMACCEL_COMPILE_WORKERS", "0")
    assert compile_pool.precompile(KernelCache(tmp_path).root, jobs) == set()
    monkeypatch.setenv("SIMACCEL_COMPILE_WORKERS", "2")
    assert compile_pool.precompile(KernelCache(tmp_path).root, jobs[:1]) == set()
    assert not any(tmp_path.glob("sk_*.py"))  # nothing was compiled


def test_two_misses_go_to_running_workers_but_do_not_start_them(tmp_path, monkeypatch):
    """Starting the workers costs more than two compiles save; once they run, two
    compile side by side."""
    monkeypatch.setenv("SIMACCEL_COMPILE_WORKERS", "2")
    compile_pool.shutdown()
    two = [(_source(k), SIG) for k in (3, 4)]
    assert compile_pool.precompile(KernelCache(tmp_path / "idle").root, two) == set()
    three = [(_source(k), SIG) for k in (5, 6, 7)]
    assert compile_pool.precompile(KernelCache(tmp_path / "start").root, three) == \
        {source for source, _ in three}
    assert compile_pool.precompile(KernelCache(tmp_path / "running").root, two) == \
        {source for source, _ in two}
    assert not compile_pool.worth_sending(1)


def test_a_graph_compiled_by_the_workers_equals_eager(monkeypatch):
    monkeypatch.setenv("SIMACCEL_COMPILE_WORKERS", "2")
    scale = float(np.random.default_rng().integers(1 << 20)) + 0.25  # new kernel sources

    def fn(x, y):
        a = (x * scale).sin().sum(-1)   # three kernels: a reduction, a GEMM epilogue,
        b = (x @ y).relu() + scale      # a pointwise kernel of another shape
        return a, b, (y - scale).exp()

    simaccel.clear_reports()
    simaccel.get_device().reset_stats()
    x, y = torch.randn(16, 8), torch.randn(8, 4)
    compiled = torch.compile(fn, backend="simaccel", dynamic=False,
                             options={"lift": "off", "tier0": False})
    for got, want in zip(compiled(x, y), fn(x, y)):
        torch.testing.assert_close(got, want, **POINTWISE_TOL)
    kernels = [k for r in simaccel.reports() for k in r.kernels if k.kind != "library"]
    assert len(kernels) >= 3 and all(k.origin == "pool" for k in kernels), kernels
    stats = simaccel.get_device().runtime_stats()
    assert stats["kernels_compiled"] == len(kernels) and stats["kernel_launches"] > 0


def test_background_compiles_wait_for_their_release(tmp_path, monkeypatch):
    """Deferred jobs reach the workers at release_deferred, not before: the first call of
    a graph runs its tier-0 kernels without workers taking its cores."""
    monkeypatch.setenv("SIMACCEL_COMPILE_WORKERS", "2")
    monkeypatch.setattr(compile_pool, "DEFER_S", 600.0)
    jobs = [(_source(k + 10), SIG) for k in range(3)]
    futures = compile_pool.submit_deferred(KernelCache(tmp_path).root, jobs)
    assert sorted(futures.values()) == sorted(s for s, _ in jobs)
    time.sleep(0.3)
    assert not any(f.done() for f in futures) and not any(tmp_path.glob("sk_*.py"))
    assert compile_pool.release_deferred() == 3
    assert compile_pool.release_deferred() == 0  # nothing queued twice
    done, _ = concurrent.futures.wait(futures, timeout=300)
    assert len(done) == 3 and {f.result() for f in futures} == {"compiled"}
    assert all(KernelCache(tmp_path).has(s, sig) for s, sig in jobs)


def test_deferred_loads_complete_at_the_release_and_reach_no_worker(monkeypatch):
    """A kernel already in the cache that only numba can load waits for the first call
    to return, like a deferred compile, but no worker is asked to compile it."""
    monkeypatch.setattr(compile_pool, "DEFER_S", 600.0)
    monkeypatch.setattr(compile_pool, "_pool", _no_pool)
    futures = compile_pool.defer_loads(["source a", "source b"])
    assert sorted(futures.values()) == ["source a", "source b"]
    assert all(compile_pool.is_deferred_load(f) and not f.done() for f in futures)
    assert compile_pool.release_deferred() == 0  # no job went to a worker
    assert {f.result(timeout=0) for f in futures} == {"disk"}
    assert not compile_pool.is_deferred_load(concurrent.futures.Future())


def _no_pool(workers: int):
    raise AssertionError("a deferred load must not start the workers")


def test_deferred_compiles_start_on_their_own_after_the_defer_time(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMACCEL_COMPILE_WORKERS", "2")
    monkeypatch.setattr(compile_pool, "DEFER_S", 0.05)
    futures = compile_pool.submit_deferred(KernelCache(tmp_path).root, [(_source(20), SIG)])
    done, _ = concurrent.futures.wait(futures, timeout=300)
    assert len(done) == 1 and next(iter(done)).result() == "compiled"


def test_a_graph_releases_its_background_compiles_when_its_first_call_returns(monkeypatch):
    """The kernels a first call runs in tier 0 are queued while it runs and sent to the
    workers after its last launch; a launch waiting for one (wait_for_kernels) releases
    it too, so nothing waits on a compile never sent."""
    monkeypatch.setenv("SIMACCEL_COMPILE_WORKERS", "2")
    monkeypatch.setattr(compile_pool, "DEFER_S", 600.0)
    scale = float(np.random.default_rng().integers(1 << 20)) + 0.75  # new kernel sources
    device = simaccel.get_device()
    device.reset_stats()
    released = []
    real_release = compile_pool.release_deferred

    def release() -> int:
        stats = device.runtime_stats()
        released.append((len(compile_pool._DEFERRED.jobs), stats.get("tier0_launches", 0),
                         stats["calls"]))
        return real_release()
    monkeypatch.setattr(compile_pool, "release_deferred", release)

    def fn(x):
        return (x * scale).sin().sum(-1), (x - scale).exp()

    x = torch.randn(16, 8)
    compiled = torch.compile(fn, backend="simaccel", dynamic=False,
                             options={"lift": "off", "tier0": True})
    for got, want in zip(compiled(x), fn(x)):
        torch.testing.assert_close(got, want, **POINTWISE_TOL)
    queued, tier0_launches, calls = released[0]
    assert queued >= 1 and tier0_launches >= 1 and calls == 1, released
    assert compile_pool._DEFERRED.jobs == []
    assert simaccel.wait_for_kernels() >= 1
    compiled(x)
    assert device.runtime_stats()["kernels_compiled"] >= 1


def test_a_first_call_that_raises_still_releases_its_background_compiles(monkeypatch):
    """A first call stopped by an out-of-range index (raised by the kernel's tier-0 form)
    sends its queued compiles to the workers all the same; the next call equals eager on
    the compiled kernels."""
    from simaccel.errors import KernelIndexError
    monkeypatch.setenv("SIMACCEL_COMPILE_WORKERS", "2")
    monkeypatch.setattr(compile_pool, "DEFER_S", 600.0)
    scale = float(np.random.default_rng().integers(1 << 20)) + 0.375  # new kernel sources

    def fn(w, i):
        return (torch.index_select(w, 0, i) * scale).exp().sum(-1)

    w, good, bad = torch.randn(10, 4) * 0.1, torch.tensor([3, 1, 9]), torch.tensor([3, 12, 9])
    compiled = torch.compile(fn, backend="simaccel", dynamic=False,
                             options={"lift": "off", "tier0": True})
    with torch.no_grad(), pytest.raises(KernelIndexError):
        compiled(w, bad)
    assert compile_pool._DEFERRED.jobs == []
    assert simaccel.wait_for_kernels() >= 1
    with torch.no_grad():
        torch.testing.assert_close(compiled(w, good), fn(w, good), **POINTWISE_TOL)

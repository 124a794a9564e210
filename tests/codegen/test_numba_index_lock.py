"""numba's cache index saved by several processes at once (simaccel.codegen.numba_index_lock):
each process saving its own signature of one function keeps its own data, as compile
workers saving signatures of one kernel_lib helper must."""
from __future__ import annotations

import multiprocessing

from numba.core.caching import IndexDataCacheFile

from simaccel.codegen.numba_index_lock import install

BASE = "kernel_lib.vexp-120.py311"
STAMP = ("source stamp", 1)
WRITERS = 4


def _save(folder: str, key: tuple, barrier: object) -> None:
    cache = IndexDataCacheFile(folder, BASE, STAMP)
    barrier.wait()  # type: ignore[attr-defined]  # every writer reads the index at once
    cache.save(key, {"code for": key, "padding": bytes(1 << 16)})


def test_processes_saving_signatures_at_once_keep_each_its_own_data(tmp_path):
    install()  # as the kernel cache does before it loads or compiles with numba
    assert getattr(IndexDataCacheFile, "_simaccel_locked", False)
    fork = multiprocessing.get_context("fork")
    for attempt in range(12):
        folder = tmp_path / str(attempt)
        folder.mkdir()
        barrier = fork.Barrier(WRITERS)
        keys = [(f"float{32 * (k + 1)}",) for k in range(WRITERS)]
        writers = [fork.Process(target=_save, args=(str(folder), key, barrier)) for key in keys]
        for w in writers:
            w.start()
        for w in writers:
            w.join(30)
            assert w.exitcode == 0
        cache = IndexDataCacheFile(str(folder), BASE, STAMP)
        loaded = {key: cache.load(key) for key in keys}
        assert all(data is not None and data["code for"] == key
                   for key, data in loaded.items()), (attempt, loaded.keys())
        assert len(list(folder.glob("*.nbc"))) == WRITERS


def test_the_kernel_cache_locks_saves_before_numba_compiles(tmp_path, monkeypatch):
    """Every load or compile with numba goes through the lock's install (a warm process
    running native kernels only never imports numba for it)."""
    from simaccel.codegen import cache as cache_module
    from tests.codegen.test_cache import SIG, SOURCE
    calls = []
    monkeypatch.setattr(cache_module, "_lock_numba_index_saves",
                        lambda: calls.append(True) or install())
    cache_module.KernelCache(tmp_path).load(SOURCE, SIG)
    assert calls and getattr(IndexDataCacheFile, "_simaccel_locked", False)

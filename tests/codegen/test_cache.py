"""The on-disk kernel cache: reuse across processes, private directory, and entries that
are missing, truncated or tampered with get rebuilt, never trusted and never a crash."""
from __future__ import annotations

import os
import stat
import textwrap
from pathlib import Path

import numba
import numpy as np
import pytest

from tests.codegen.child import run_child_program
from simaccel.codegen.cache import KernelCache, numba_cache_dirs
from simaccel.errors import CacheDirectoryError, SimAccelError

SOURCE = textwrap.dedent("""\
    import numba
    import numpy as np


    @numba.njit(cache=True)
    def kernel(out, a):
        for i in range(a.shape[0]):
            out[i] = a[i] * np.float32(2.0) + np.float32(1.0)
    """)
F32 = numba.types.Array(numba.float32, 1, "C")
SIG = (F32, F32)

PROGRAM = textwrap.dedent("""\
    import json, torch, simaccel
    x = torch.arange(12.0).reshape(3, 4)
    f = torch.compile(lambda x: (x * 2 + 1).relu().sum(0), backend="simaccel")
    out = f(x)
    assert torch.allclose(out, (x * 2 + 1).relu().sum(0))
    print(json.dumps(simaccel.get_device().runtime_stats()))
    """)


def _run_program(cache_dir: Path, **env: str) -> dict:
    return run_child_program(PROGRAM, cache_dir, **env)


def test_second_process_loads_kernels_from_disk(tmp_path):
    first = _run_program(tmp_path)
    assert first["kernels_compiled"] > 0 and first["kernel_cache_hits"] == 0
    second = _run_program(tmp_path)
    assert second["kernel_cache_hits"] == first["kernels_compiled"]
    assert second["kernels_compiled"] == 0


def test_kernels_run_uncompiled_under_numba_disable_jit(tmp_path):
    stats = _run_program(tmp_path, NUMBA_DISABLE_JIT="1")
    assert stats["kernel_launches"] > 0


def _run(fn) -> np.ndarray:
    a = np.arange(5, dtype=np.float32)
    out = np.empty_like(a)
    fn(out, a)
    return out


def test_cache_directory_is_private(tmp_path):
    root = tmp_path / "cache"
    cache = KernelCache(root)
    loaded = cache.load(SOURCE, SIG)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE(loaded.path.stat().st_mode) == 0o600
    np.testing.assert_array_equal(_run(loaded.fn), np.arange(5) * 2 + 1)


@pytest.mark.parametrize("mode", [0o770, 0o777, 0o1777])
def test_directory_others_can_write_is_refused(tmp_path, mode):
    """Issue 18: code others could have planted is never loaded; the error names the path
    and the way out, and nothing is written there."""
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, mode)
    with pytest.raises(CacheDirectoryError, match="writable by other users") as info:
        KernelCache(root).load(SOURCE, SIG)
    assert str(root) in str(info.value) and "SIMACCEL_CACHE_DIR" in str(info.value)
    assert list(root.iterdir()) == []
    assert stat.S_IMODE(root.stat().st_mode) == mode  # refused, not silently re-moded


def test_numba_pycache_is_private_too(tmp_path):
    root = tmp_path / "cache"
    KernelCache(root).load(SOURCE, SIG)
    assert stat.S_IMODE((root / "__pycache__").stat().st_mode) == 0o700
    os.chmod(root / "__pycache__", 0o777)
    with pytest.raises(CacheDirectoryError, match="__pycache__"):
        KernelCache(root).load(SOURCE, SIG)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to hand the directory to another user")
def test_directory_owned_by_someone_else_is_refused(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    os.chown(root, 65534, -1)
    with pytest.raises(SimAccelError, match="SIMACCEL_CACHE_DIR"):
        KernelCache(root).load(SOURCE, SIG)


@pytest.mark.parametrize("damage", ["tamper", "truncate", "delete"])
def test_damaged_module_is_rewritten_and_recompiled(tmp_path, damage, caplog):
    first = KernelCache(tmp_path).load(SOURCE, SIG)
    if damage == "tamper":  # code that would run if trusted: it must never be imported
        first.path.write_text(SOURCE.replace("* np.float32(2.0)", "* np.float32(-7.0)"))
    elif damage == "truncate":
        first.path.write_text(SOURCE[: len(SOURCE) // 2])
    else:
        first.path.unlink()
    again = KernelCache(tmp_path).load(SOURCE, SIG)  # a new process's cache object
    assert again.path.read_text() == SOURCE
    np.testing.assert_array_equal(_run(again.fn), np.arange(5) * 2 + 1)
    if damage != "delete":
        assert "does not match its hash" in caplog.text


def test_corrupt_numba_cache_file_is_purged_and_recompiled(tmp_path, caplog):
    loaded = KernelCache(tmp_path).load(SOURCE, SIG)
    entries = [e for d in numba_cache_dirs(loaded.path)
               for e in d.rglob(f"{loaded.path.stem}.*.nbc")]
    assert entries, "numba cached nothing for the kernel"
    for entry in entries:
        entry.write_bytes(b"\x80garbage")
    again = KernelCache(tmp_path).load(SOURCE, SIG)
    np.testing.assert_array_equal(_run(again.fn), np.arange(5) * 2 + 1)

"""simaccel in torch's Mega-Cache: ``torch.compiler.save_cache_artifacts()`` carries the
kernels a process used; a new process on empty caches that loads them compiles none."""
from __future__ import annotations

import hashlib
import logging
import textwrap

from simaccel.codegen.cache import DEFAULT_CACHE
from simaccel.guards.dynamo.megacache import SimaccelCacheArtifact
from tests.codegen.child import run_child_program

MODEL = """\
    import json, sys, torch, simaccel
    torch.manual_seed(0)
    x = torch.randn(8, 32)
    m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))
    f = torch.compile(m, backend="simaccel")
    out = f(x)
    torch.testing.assert_close(out, m(x), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    big = torch.randn(256, 512)  # exp and log over 128K elements: a kernel in numba's
    g = torch.compile(lambda t: (t.exp() * 2 + 1).log(), backend="simaccel")  # threads
    torch.testing.assert_close(g(big), (big.exp() * 2 + 1).log(), rtol=1e-5, atol=1e-5)
"""
SAVE = textwrap.dedent(MODEL + """\
    blob, info = torch.compiler.save_cache_artifacts()
    open({path!r}, "wb").write(blob)
    print(json.dumps({{"artifacts": len(info.artifacts["simaccel"]),
                      **simaccel.get_device().runtime_stats()}}))
""")
LOAD = textwrap.dedent("""\
    import json, torch, simaccel
    info = torch.compiler.load_cache_artifacts(open({path!r}, "rb").read())
""") + textwrap.dedent(MODEL + """\
    simaccel.wait_for_kernels()  # a kernel only numba loads is loaded after its first call
    print(json.dumps(simaccel.get_device().runtime_stats()))
""")


def test_artifacts_round_trip_into_empty_caches(tmp_path):
    """The saving process runs tier 0 (two compile workers): its save waits for the
    kernels still compiling, so the artifacts carry all of them, the one that runs in
    numba's thread pool (no native object) as numba's own cache files."""
    blob = tmp_path / "artifacts.bin"
    first = run_child_program(SAVE.format(path=str(blob)), tmp_path / "a",
                              NUMBA_CACHE_DIR=str(tmp_path / "numba-a"),
                              SIMACCEL_COMPILE_WORKERS="2")
    assert first["tier0_launches"] > 0
    assert first["kernels_compiled"] > 0 and first["artifacts"] >= first["kernels_compiled"]
    second = run_child_program(LOAD.format(path=str(blob)), tmp_path / "b",
                               NUMBA_CACHE_DIR=str(tmp_path / "numba-b"))
    assert second["kernels_compiled"] == 0
    assert second["kernel_cache_hits"] == first["kernels_compiled"]
    assert second["kernel_launches"] == first["kernel_launches"] > 0


def test_a_damaged_or_foreign_artifact_is_skipped_with_a_warning(caplog):
    root = DEFAULT_CACHE.root
    digest = hashlib.sha256(b"print('original')\n").hexdigest()[:24]
    cases = [f"kernel/sk_{digest}.py", "kernel/../../escape.py", "lift/not-an-entry.json",
             "unknown/file", f"kernel/sk_{digest}.kernel-10.py311.nbi"]
    with caplog.at_level(logging.WARNING, logger="simaccel"):
        for key in cases:
            SimaccelCacheArtifact(key, b"print('tampered')\n").populate_cache()
    assert not (root / f"sk_{digest}.py").exists()
    assert not (root.parent / "escape.py").exists()
    assert not list(root.parent.rglob(f"sk_{digest}.kernel-*"))
    assert len([r for r in caplog.records if "skipping" in r.getMessage()]) == len(cases)


def test_a_numba_index_artifact_gives_its_module_the_time_numba_checks(tmp_path, monkeypatch):
    """numba's index is valid only for the module's modification time when it was made:
    written back in either order, module and index agree on it."""
    import json
    import os

    from simaccel.codegen.cache import KernelCache

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    mtime_ns = 1_700_000_000_123_456_789
    for k, order in enumerate((("nbi", "py"), ("py", "nbi"))):
        source = f"print('kernel {k}')\n".encode()  # its own module name per order
        stem = "sk_" + hashlib.sha256(source).hexdigest()[:24]
        cache = KernelCache(tmp_path / f"cache{k}")
        index = b"numba index bytes"
        header = json.dumps({"sha256": hashlib.sha256(index).hexdigest(),
                             "module_mtime_ns": mtime_ns}).encode()
        for kind in order:
            if kind == "py":
                cache.populate(f"{stem}.py", source)
            else:
                cache.populate(f"{stem}.kernel-3.py311.nbi", header + b"\n" + index)
        assert (cache.root / "__pycache__" / f"{stem}.kernel-3.py311.nbi").read_bytes() == index
        assert os.stat(cache.root / f"{stem}.py").st_mtime_ns == mtime_ns

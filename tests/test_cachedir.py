"""simaccel.cachedir: the cache directory holds code simaccel runs (issue 18), so every
directory simaccel creates is 0700 whatever the umask, and a directory other users can
write to (or own) is refused with an error naming it."""
from __future__ import annotations

import os
import stat
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from simaccel.cachedir import (
    default_cache_dir, ensure_private_dir, private_subdir, write_atomic,
)
from simaccel.errors import CacheDirectoryError, SimAccelError
from tests.codegen.child import run_child_program


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(params=[0o022, 0o002, 0o277], ids=["umask 022", "umask 002", "umask 277"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """Run the test under an umask (0o277 would leave a plain ``mkdir(mode=0o700)`` with
    0500: no way to create anything inside)."""
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def test_default_location_follows_xdg_and_the_env_override(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("SIMACCEL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "simaccel" / "kernels"
    monkeypatch.setenv("SIMACCEL_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"


def test_every_directory_simaccel_creates_is_0700(monkeypatch, tmp_path, umask) -> None:
    """``~/.cache/simaccel/kernels`` and its ``lift/`` are created from scratch: each level
    simaccel makes is 0700 (it was 0755: the parents of ``lift/`` got the umask's mode)."""
    monkeypatch.delenv("SIMACCEL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))
    lift = private_subdir(default_cache_dir(), "lift")
    write_atomic(lift / "entry.json", b"{}")
    for directory in (tmp_path / "home", tmp_path / "home" / ".cache",
                      tmp_path / "home" / ".cache" / "simaccel", default_cache_dir(), lift):
        assert mode(directory) == 0o700, directory
    assert mode(lift / "entry.json") & 0o077 == 0


def test_the_kernel_cache_creates_private_directories(tmp_path) -> None:
    from simaccel.codegen.cache import KernelCache
    from tests.codegen.test_cache import SIG, SOURCE

    root = tmp_path / "fresh" / "kernels"
    loaded = KernelCache(root).load(SOURCE, SIG)
    assert loaded.path.parent == root
    for directory in (tmp_path / "fresh", root, root / "__pycache__"):
        assert mode(directory) == 0o700, directory


def test_an_existing_private_enough_directory_is_used_as_it_is(tmp_path) -> None:
    """Readable by others but writable only by the user: nobody can plant code; simaccel
    does not change the mode of a directory it did not create."""
    root = tmp_path / "shared-read"
    root.mkdir()
    os.chmod(root, 0o755)
    assert ensure_private_dir(root) == root
    assert mode(root) == 0o755


@pytest.mark.parametrize("bits", [0o020, 0o002, 0o022, 0o1777])
def test_a_directory_others_can_write_is_refused_naming_it(tmp_path, bits: int) -> None:
    root = tmp_path / "open"
    root.mkdir()
    os.chmod(root, 0o700 | bits)
    with pytest.raises(CacheDirectoryError) as info:
        ensure_private_dir(root)
    message = str(info.value)
    assert str(root) in message and "writable by other users" in message
    assert f"chmod 700 {root}" in message and "SIMACCEL_CACHE_DIR" in message
    assert isinstance(info.value, SimAccelError)


def test_a_private_subdirectory_of_an_open_directory_is_refused(tmp_path) -> None:
    """Others who can write the parent can swap the subdirectory for their own."""
    root = tmp_path / "open"
    (root / "lift").mkdir(parents=True)
    os.chmod(root / "lift", 0o700)
    os.chmod(root, 0o777)
    with pytest.raises(CacheDirectoryError, match=str(root)):
        private_subdir(root, "lift")


def test_a_file_in_place_of_the_directory_is_refused(tmp_path) -> None:
    path = tmp_path / "not-a-dir"
    path.write_text("x")
    with pytest.raises(CacheDirectoryError, match="not a directory"):
        ensure_private_dir(path)


def test_lifting_memory_refuses_an_open_cache_directory(monkeypatch, tmp_path) -> None:
    import torch

    root = tmp_path / "open"
    root.mkdir()
    os.chmod(root, 0o777)
    monkeypatch.setenv("SIMACCEL_CACHE_DIR", str(root))

    def shifted(x: torch.Tensor, a: float) -> torch.Tensor:
        return x + a

    with pytest.raises(Exception) as info:
        torch.compile(shifted, backend="simaccel", dynamic=False)(torch.ones(3), 0.5)
    assert str(root) in str(info.value) and "writable by other users" in str(info.value)
    assert list(root.iterdir()) == []


CHILD = textwrap.dedent("""
    import json, torch, simaccel
    from simaccel.errors import CacheDirectoryError
    f = torch.compile(lambda x: x * 2 + 1, backend="simaccel", options={"lift": "off"})
    try:
        f(torch.ones(3))
        found = None
    except Exception as err:
        while err is not None and not isinstance(err, CacheDirectoryError):
            err = getattr(err, "inner_exception", None) or err.__cause__
        found = str(err) if err is not None else "no CacheDirectoryError"
    print(json.dumps({"error": found}))
""")


def test_a_new_process_refuses_to_load_kernels_from_an_open_cache(tmp_path) -> None:
    root = tmp_path / "open"
    root.mkdir()
    os.chmod(root, 0o777)
    error = run_child_program(CHILD, root)["error"]
    assert error is not None and str(root) in error and "writable by other users" in error
    assert not any(root.glob("sk_*"))

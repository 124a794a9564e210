"""simaccel's cache directory: where it is, and keeping it private to the user.

The directory (``$SIMACCEL_CACHE_DIR``, default ``$XDG_CACHE_HOME/simaccel/kernels``) holds
generated kernel modules and native objects that simaccel imports and runs, numba's
machine code (``__pycache__``) and the lifting memory (``lift/``). So:

* every directory simaccel creates, on the way to the cache directory or under it, gets
  mode 0700: ``mkdir`` then ``chmod``, because ``mkdir``'s mode is filtered by the umask;
* an existing directory is used only if it belongs to the user and neither its group nor
  other users can write to it (someone who can write there can plant code that simaccel
  would run); anything else raises :class:`~simaccel.errors.CacheDirectoryError` naming
  the path and what to do. Existing directories are checked, never re-moded: simaccel does
  not change the permissions of a directory it did not create;
* files are written atomically with mode 0600 (:func:`write_atomic`).

Imports only the standard library and :mod:`simaccel.errors`, so every layer may use it
(the kernel cache in ``codegen`` and the lifting memory in ``guards``).
"""
from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: processes work independently
    fcntl = None  # type: ignore[assignment]

from simaccel.errors import CacheDirectoryError

#: mode of every directory simaccel creates
PRIVATE_DIR_MODE = 0o700
#: mode of every file simaccel writes
PRIVATE_FILE_MODE = 0o600


def default_cache_dir() -> Path:
    """``$SIMACCEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/simaccel/kernels`` (``~/.cache``)."""
    env = os.environ.get("SIMACCEL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "simaccel" / "kernels"


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and each missing parent) with mode 0700, or check that the existing
    directory is private; returns ``path``.

    Raises :class:`CacheDirectoryError` if ``path`` is not a directory, belongs to another
    user, or its group or other users can write to it.
    """
    _create_missing(path)
    check_private_dir(path)
    return path


def private_subdir(root: Path, name: str) -> Path:
    """``root / name``, made or checked like :func:`ensure_private_dir` together with
    ``root`` itself (a private subdirectory of a directory others can write to is not
    private: they can rename it away and put their own in its place)."""
    return ensure_private_dir(ensure_private_dir(root) / name)


def check_private_dir(path: Path) -> None:
    """Raise :class:`CacheDirectoryError` unless ``path`` is a directory that belongs to
    the user and that neither its group nor other users can write to."""
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise CacheDirectoryError(
            f"cache path {path} is not a directory; set SIMACCEL_CACHE_DIR to a directory "
            f"you own.")
    if info.st_uid != os.getuid():
        raise CacheDirectoryError(
            f"cache directory {path} belongs to uid {info.st_uid}, not to you "
            f"(uid {os.getuid()}); simaccel runs code from it. Set SIMACCEL_CACHE_DIR to a "
            f"directory you own.")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheDirectoryError(
            f"cache directory {path} is writable by other users (mode "
            f"{stat.S_IMODE(info.st_mode):04o}); simaccel runs code from it, so it refuses "
            f"to use it. Make it private (chmod 700 {path}) if you trust its contents, or "
            f"set SIMACCEL_CACHE_DIR to another directory.")


def _create_missing(path: Path) -> None:
    """Make every missing directory of ``path``, outermost first, with mode 0700."""
    missing = []
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by another process: checked as an existing one
        os.chmod(directory, PRIVATE_DIR_MODE)


def write_atomic(path: Path, content: bytes) -> None:
    """Write ``path`` (mode 0600) so that a concurrent reader never sees a partial file."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
    os.replace(tmp, path)


@contextlib.contextmanager
def exclusive_lock(path: Path | str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the lock file ``path`` (created if missing) for the
    ``with`` block, across processes; a no-op where there is no ``fcntl``."""
    if fcntl is None:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock

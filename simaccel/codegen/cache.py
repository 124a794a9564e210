"""The on-disk kernel cache.

Each generated kernel is written as a real module ``sk_<sha256>.py`` under the cache
directory and compiled by ``numba.njit(cache=True)``, which stores its machine code
in ``__pycache__`` beside it. A second process that generates the same source
imports the same module and numba loads the compiled code from disk.

The cache holds code that gets executed, so: the directory is created private to
the user (mode 0700) and refused if another user owns it; a module is imported only
when its content hashes to its name; a missing, truncated or tampered entry is
rewritten and recompiled, never trusted and never a crash.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from simaccel.errors import KernelCompileError, SimAccelError

log = logging.getLogger("simaccel.codegen")

_HASH_CHARS = 24


def default_cache_dir() -> Path:
    """``$SIMACCEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/simaccel/kernels`` (``~/.cache``)."""
    env = os.environ.get("SIMACCEL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "simaccel" / "kernels"


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` with mode 0700, or check an existing one is ours and private."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise SimAccelError(
            f"kernel cache directory {path} belongs to uid {info.st_uid}, not to you "
            f"(uid {os.getuid()}); set SIMACCEL_CACHE_DIR to a directory you own.")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        # Others could plant code there: tighten it rather than trust it.
        os.chmod(path, 0o700)
    return path


@dataclass
class LoadedKernel:
    """A compiled kernel: ``fn`` takes flat arrays; ``origin`` says where it came from:
    ``"compiled"`` (numba compiled it now), ``"disk"`` (numba's on-disk cache) or
    ``"memory"`` (already loaded in this process)."""

    fn: Callable[..., Any]
    origin: str
    path: Path
    digest: str


class KernelCache:
    """Writes, verifies, imports and compiles kernel modules; thread safe."""

    def __init__(self, root: Path | None = None):
        self._root = root
        self._lock = threading.RLock()
        self._loaded: dict[tuple[str, tuple], Callable[..., Any]] = {}

    @property
    def root(self) -> Path:
        if self._root is None:
            self._root = default_cache_dir()
        return ensure_private_dir(self._root)

    def load(self, source: str, signature: tuple) -> LoadedKernel:
        """Compile ``source``'s ``kernel`` function for ``signature`` (numba types)."""
        digest = hashlib.sha256(source.encode()).hexdigest()[:_HASH_CHARS]
        with self._lock:
            path = self.root / f"sk_{digest}.py"
            fn = self._loaded.get((digest, signature))
            if fn is not None:
                return LoadedKernel(fn, "memory", path, digest)
            self._write_verified(path, source, digest)
            try:
                fn, origin = self._import_and_compile(path, digest, signature)
            except Exception as first:  # a corrupt numba cache entry: purge and rebuild once
                log.warning("kernel %s failed to load (%s); purging its cache entry and "
                            "recompiling", path.name, first)
                self._purge_numba_cache(path)
                self._write_verified(path, source, digest, force=True)
                try:
                    fn, origin = self._import_and_compile(path, digest, signature)
                except Exception as exc:
                    raise KernelCompileError(
                        f"numba could not compile kernel {path}: {exc}") from exc
            self._loaded[(digest, signature)] = fn
            return LoadedKernel(fn, origin, path, digest)

    def _write_verified(self, path: Path, source: str, digest: str, force: bool = False) -> None:
        if not force and path.exists():
            content = path.read_bytes()
            if hashlib.sha256(content).hexdigest()[:_HASH_CHARS] == digest:
                return
            log.warning("kernel cache entry %s does not match its hash (truncated or "
                        "tampered); rewriting and recompiling it", path)
            self._purge_numba_cache(path)
        tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(source)
        os.replace(tmp, path)  # atomic: a concurrent reader never sees a partial file

    def _import_and_compile(self, path: Path, digest: str, signature: tuple):
        name = f"simaccel_kernel_{digest}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise KernelCompileError(f"cannot import kernel module {path}")
        module = importlib.util.module_from_spec(spec)
        # numba's cache rebuilds a kernel's environment by importing its module by name
        sys.modules[name] = module
        spec.loader.exec_module(module)
        dispatcher = module.kernel
        if not hasattr(dispatcher, "compile"):  # NUMBA_DISABLE_JIT=1: plain Python
            return dispatcher, "compiled"
        dispatcher.compile(signature)
        hits = sum(dispatcher.stats.cache_hits.values())
        return dispatcher, ("disk" if hits else "compiled")

    def _purge_numba_cache(self, path: Path) -> None:
        pycache = path.parent / "__pycache__"
        if not pycache.is_dir():
            return
        for entry in pycache.glob(f"{path.stem}.*"):
            try:
                entry.unlink()
            except OSError:
                pass

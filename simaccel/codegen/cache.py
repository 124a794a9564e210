"""The on-disk kernel cache.

Each generated kernel is written as a real module ``sk_<sha256>.py`` under the cache
directory and compiled by ``numba.njit(cache=True)``, which stores its machine code
in ``__pycache__`` beside it. Self-contained kernels are also exported as a native
object ``sk_<sha256>.<host tag>.native`` (:mod:`simaccel.codegen.native`): a second
process that generates the same source loads that object without importing numba at
all, else it imports the same module and numba loads the compiled code from disk.

Signatures are tuples of numba type names (``"array(float32, 1d, C)"``, ``"int64"``) so
that a warm process needs no numba to look a kernel up; numba types are accepted too.

The cache holds code that gets executed, so: the directory is created private to
the user (mode 0700) and refused if another user owns it; a module is imported only
when its content hashes to its name, a native object only when its header's hash
matches its code; a missing, truncated or tampered entry is rewritten and recompiled,
never trusted and never a crash.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import stat
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from simaccel.codegen import native
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
    ``"compiled"`` (numba compiled it now), ``"disk"`` (a native object or numba's on-disk
    cache) or ``"memory"`` (already loaded in this process)."""

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
        """Compile ``source``'s ``kernel`` function for ``signature`` (numba type names
        or numba types), or load it from the cache."""
        digest = hashlib.sha256(source.encode()).hexdigest()[:_HASH_CHARS]
        key = tuple(str(t) for t in signature)
        with self._lock:
            path = self.root / f"sk_{digest}.py"
            fn = self._loaded.get((digest, key))
            if fn is not None:
                return LoadedKernel(fn, "memory", path, digest)
            self._write_verified(path, source, digest)
            fn = self._load_native(path, key)
            origin = "disk"
            if fn is None:
                fn, origin = self._load_with_numba(path, source, digest, signature)
            self._loaded[(digest, key)] = fn
            return LoadedKernel(fn, origin, path, digest)

    def _load_with_numba(self, path: Path, source: str, digest: str,
                         signature: tuple) -> tuple[Callable[..., Any], str]:
        numba_sig = numba_signature(signature)
        try:
            fn, origin = self._import_and_compile(path, digest, numba_sig)
        except Exception as first:  # a corrupt numba cache entry: purge and rebuild once
            log.warning("kernel %s failed to load (%s); purging its cache entry and "
                        "recompiling", path.name, first)
            self._purge_numba_cache(path)
            self._write_verified(path, source, digest, force=True)
            try:
                fn, origin = self._import_and_compile(path, digest, numba_sig)
            except Exception as exc:
                raise KernelCompileError(
                    f"numba could not compile kernel {path}: {exc}") from exc
        if origin == "compiled" and hasattr(fn, "overloads"):
            self._save_native(path, tuple(str(t) for t in signature), fn, numba_sig)
        return fn, origin

    # ------------------------------------------------------------------ native objects

    def _native_path(self, path: Path, key: tuple[str, ...]) -> Path | None:
        if _jit_disabled():
            return None
        return path.with_name(f"{path.stem}.{native.host_tag(key, _numba_version())}.native")

    def _load_native(self, path: Path, key: tuple[str, ...]) -> Callable[..., Any] | None:
        native_path = self._native_path(path, key)
        if native_path is None or not native_path.exists():
            return None
        try:
            fn = native.load_object(native_path.read_bytes(), key)
        except Exception as exc:  # unreadable, or LLVM refused it: numba rebuilds it
            log.debug("native kernel %s failed to load: %s", native_path.name, exc)
            fn = None
        if fn is None:
            log.warning("native kernel %s is damaged or does not fit this process; "
                        "removing it and compiling with numba", native_path.name)
            native_path.unlink(missing_ok=True)
        return fn

    def _save_native(self, path: Path, key: tuple[str, ...], dispatcher: Any,
                     numba_sig: tuple) -> None:
        """Export a freshly compiled kernel as a native object (best effort: a kernel that
        cannot be exported simply stays numba-only)."""
        native_path = self._native_path(path, key)
        if native_path is None:
            return
        try:
            result = dispatcher.overloads[numba_sig]
            blob = native.export_object(result.library.get_llvm_str(),
                                        result.fndesc.mangled_name, key)
        except Exception as exc:  # an export problem must never fail the compile
            log.debug("kernel %s not exported as a native object: %s", path.name, exc)
            return
        if blob is not None:
            write_atomic(native_path, blob)

    def _write_verified(self, path: Path, source: str, digest: str, force: bool = False) -> None:
        if not force and path.exists():
            content = path.read_bytes()
            if hashlib.sha256(content).hexdigest()[:_HASH_CHARS] == digest:
                return
            log.warning("kernel cache entry %s does not match its hash (truncated or "
                        "tampered); rewriting and recompiling it", path)
            self._purge_numba_cache(path)
        write_atomic(path, source.encode())

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
        entries = list(path.parent.glob(f"{path.stem}.*.native"))
        if pycache.is_dir():
            entries += pycache.glob(f"{path.stem}.*")
        for entry in entries:
            try:
                entry.unlink()
            except OSError:
                pass


def write_atomic(path: Path, content: bytes) -> None:
    """Write ``path`` (mode 0600) so that a concurrent reader never sees a partial file."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
    os.replace(tmp, path)


def _jit_disabled() -> bool:
    """``NUMBA_DISABLE_JIT=1``: kernels run as plain Python, nothing native is used."""
    return os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0")


@functools.lru_cache(maxsize=1)
def _numba_version() -> str:
    """numba's version without importing numba (part of a native object's key)."""
    try:
        return importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:  # a source checkout of numba
        return "unknown"


def numba_signature(signature: tuple) -> tuple:
    """numba types for a signature of type names (numba types pass through)."""
    import numba
    import numpy as np

    types = []
    for arg in signature:
        if not isinstance(arg, str):
            types.append(arg)
        elif native.array_dtype(arg):
            types.append(numba.types.Array(numba.from_dtype(np.dtype(native.array_dtype(arg))),
                                           1, "C"))
        else:
            types.append(getattr(numba.types, arg))
    return tuple(types)

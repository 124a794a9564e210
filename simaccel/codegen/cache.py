"""The on-disk kernel cache.

Each generated kernel is written as a real module ``sk_<sha256>.py`` under the cache
directory and compiled by ``numba.njit(cache=True)``, which stores its machine code
in ``__pycache__`` beside it. Self-contained kernels are also exported as a native
object ``sk_<sha256>.<host tag>.native`` (:mod:`simaccel.codegen.native`): a second
process that generates the same source loads that object without importing numba at
all, else it imports the same module and numba loads the compiled code from disk. The
compiling process runs the exported object too, so every process launches the same
native kernels (and their launch groups as command lists).

Signatures are tuples of numba type names (``"array(float32, 1d, C)"``, ``"int64"``) so
that a warm process needs no numba to look a kernel up; numba types are accepted too.

The cache holds code that gets executed, so: the directory and numba's ``__pycache__`` in
it are created private to the user (mode 0700) and refused if another user owns them or
can write to them (:mod:`simaccel.cachedir`); a module is imported only
when its content hashes to its name, a native object only when its header's hash
matches its code; a missing, truncated or tampered entry is rewritten and recompiled,
never trusted and never a crash.

Processes sharing a cache directory (the ranks of a data-parallel job, xdist workers)
compile a kernel once between them: the first to miss holds a lock file for that kernel
(``flock``) while it compiles and exports it; the others wait on the lock and then load
what it wrote.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import sys
import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from simaccel.cachedir import (default_cache_dir, ensure_private_dir, exclusive_lock,
                               write_atomic)
from simaccel.codegen import native, numba_entry, numba_files
from simaccel.codegen.numba_index_lock import install as _lock_numba_index_saves
from simaccel.codegen.threads import start_kernel_threads
from simaccel.errors import KernelCompileError
from simaccel.guards.dynamo import megacache

log = logging.getLogger("simaccel.codegen")

_HASH_CHARS = 24
#: the file names a Mega-Cache artifact may write: a kernel module or its native object
_ARTIFACT_NAME = re.compile(rf"sk_([0-9a-f]{{{_HASH_CHARS}}})(\.py|\.[0-9a-f]+\.native)")


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
        """The cache directory, checked private on every use; numba's and Python's
        ``__pycache__`` in it is made private before either would create it (0755)."""
        if self._root is None:
            self._root = default_cache_dir()
        root = ensure_private_dir(self._root)
        ensure_private_dir(root / "__pycache__")
        return root

    def load(self, source: str, signature: tuple) -> LoadedKernel:
        """Compile ``source``'s ``kernel`` function for ``signature`` (numba type names
        or numba types), or load it from the cache."""
        digest, key = _identity(source, signature)
        with self._lock:
            path = self.root / f"sk_{digest}.py"
            fn = self._loaded.get((digest, key))
            if fn is not None:
                return LoadedKernel(fn, "memory", path, digest)
            if "parallel=True" in source:
                start_kernel_threads()  # before numba starts them (threads.py says why)
            with _compile_lock(path):
                self._write_verified(path, source, digest)
                fn = self._load_native(path, key)
                origin = "disk"
                if fn is None:
                    fn, origin = self._load_with_numba(path, source, digest, signature, key)
                    numba_files.record(path)  # no native object: numba's files carry it
            self._loaded[(digest, key)] = fn
            # for torch's Mega-Cache (save_cache_artifacts); the native object is recorded
            # where its bytes are at hand (loaded or exported)
            megacache.record("kernel", path.name, source.encode())
            return LoadedKernel(fn, origin, path, digest)

    def has(self, source: str, signature: tuple) -> bool:
        """True if :meth:`load` would find the kernel without compiling it: loaded in
        this process, its native object on disk, or numba's index of its module (a quick
        look, no verification: a damaged entry still recompiles in :meth:`load`)."""
        digest, key = _identity(source, signature)
        if (digest, key) in self._loaded:
            return True
        path = self.root / f"sk_{digest}.py"
        native_path = self._native_path(path, key)
        if native_path is not None and native_path.exists():
            return True
        return path.exists() and any(any(d.glob(f"{path.stem}.*.nbi"))
                                     for d in numba_cache_dirs(path))

    def needs_numba(self, source: str, signature: tuple) -> bool:
        """True if :meth:`load` would have to import numba (~0.5 s) to load the kernel:
        not loaded in this process and no native object on disk (a kernel that runs in
        numba's thread pool has none)."""
        digest, key = _identity(source, signature)
        if (digest, key) in self._loaded:
            return False
        native_path = self._native_path(self.root / f"sk_{digest}.py", key)
        return native_path is None or not native_path.exists()

    def populate(self, name: str, content: bytes) -> None:
        """Write a kernel file a Mega-Cache artifact carried (``load_cache_artifacts``):
        only a kernel module, native object or numba cache file name
        (:mod:`.numba_files`), and a module only if its content
        hashes to its name (a native object's header hash is checked when it loads). A
        refused artifact is skipped with a warning: the kernel compiles when needed."""
        if numba_files.NAME.fullmatch(name):
            numba_files.populate(self.root, name, content)
            return
        match = _ARTIFACT_NAME.fullmatch(name)
        if match is None:
            log.warning("simaccel: skipping a cache artifact named %r: not a kernel file", name)
            return
        if match[2] == ".py" and hashlib.sha256(content).hexdigest()[:_HASH_CHARS] != match[1]:
            log.warning("simaccel: skipping cache artifact %s: its content does not match its "
                        "hash (damaged or tampered); the kernel compiles when needed", name)
            return
        write_atomic(self.root / name, content)
        mtime_ns = numba_files.module_mtime(name)
        if mtime_ns is not None:  # numba's index (populated first) expects this time
            os.utime(self.root / name, ns=(mtime_ns, mtime_ns))

    def _load_with_numba(self, path: Path, source: str, digest: str, signature: tuple,
                         key: tuple[str, ...]) -> tuple[Callable[..., Any], str]:
        _lock_numba_index_saves()  # before numba compiles (and saves) any helper
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
            blob = self._save_native(path, key, fn, numba_sig)
            # run the native object a later process loads (~1 ms to load), not numba's
            # dispatcher: the same machine code, and a launch group of native kernels
            # becomes one command list (numba's dispatch costs ~1 us a launch)
            fn = self._load_exported(blob, key, path) or fn
        elif origin == "disk" and self._exported_for_another_host(path, key):
            exported = self._export_again(path, key, fn, numba_sig)
            if exported is not None:
                fn, origin = exported, "compiled"
        if hasattr(fn, "overloads"):  # numba-only (a prange kernel): its machine code
            fn = numba_entry.entry_kernel(fn, numba_sig, key) or fn
        return fn, origin

    def _exported_for_another_host(self, path: Path, key: tuple[str, ...]) -> bool:
        """Whether numba's cache served a kernel that was exported before, but under
        another host tag than this process's (an older simaccel's tag, or another CPU
        sharing the cache): it has no native object here yet."""
        own = self._native_path(path, key)
        return own is not None and not own.exists() and any(path.parent.glob(
            f"{path.stem}.*.native"))

    def _export_again(self, path: Path, key: tuple[str, ...], dispatcher: Any,
                      numba_sig: tuple) -> Callable[..., Any] | None:
        """Compile the kernel once more, without numba's cache (whose code has no LLVM
        module to export), to export and run it as a native object for this host; None
        if that fails (numba's cached kernel runs then)."""
        import numba
        try:
            fresh = numba.njit(**dispatcher.targetoptions)(dispatcher.py_func)
            fresh.compile(numba_sig)
        except Exception as exc:  # noqa: BLE001 - numba's cached kernel is the same
            log.debug("kernel %s not compiled again for export: %s", path.name, exc)
            return None
        log.info("simaccel: kernel %s exported again for this host", path.name)
        return self._load_exported(self._save_native(path, key, fresh, numba_sig), key, path)

    @staticmethod
    def _load_exported(blob: bytes | None, key: tuple[str, ...], path: Path
                       ) -> Callable[..., Any] | None:
        """The native kernel of a just exported object, or None (not exported, or LLVM
        refused it: numba's dispatcher runs it then)."""
        if blob is None:
            return None
        try:
            return native.load_object(blob, key)
        except Exception as exc:  # noqa: BLE001 - the dispatcher is the same kernel
            log.debug("kernel %s: its native object did not load: %s", path.name, exc)
            return None

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
            blob = native_path.read_bytes()
            fn = native.load_object(blob, key)
        except Exception as exc:  # unreadable, or LLVM refused it: numba rebuilds it
            log.debug("native kernel %s failed to load: %s", native_path.name, exc)
            fn = None
        if fn is None:
            log.warning("native kernel %s is damaged or does not fit this process; "
                        "removing it and compiling with numba", native_path.name)
            native_path.unlink(missing_ok=True)
        else:
            megacache.record("kernel", native_path.name, blob)
        return fn

    def _save_native(self, path: Path, key: tuple[str, ...], dispatcher: Any,
                     numba_sig: tuple) -> bytes | None:
        """Export a freshly compiled kernel as a native object (best effort: a kernel that
        cannot be exported simply stays numba-only); returns the object, or None."""
        native_path = self._native_path(path, key)
        if native_path is None:
            return None
        try:
            result = dispatcher.overloads[numba_sig]
            blob = native.export_object(result.library.get_llvm_str(),
                                        result.fndesc.mangled_name, key)
        except Exception as exc:  # an export problem must never fail the compile
            log.debug("kernel %s not exported as a native object: %s", path.name, exc)
            return None
        if blob is not None:
            write_atomic(native_path, blob)
            megacache.record("kernel", native_path.name, blob)
        return blob

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
        """Remove everything compiled from the kernel module ``path``: its native objects
        and numba's cache entries (named after the module; rare, so a directory walk of
        ``NUMBA_CACHE_DIR`` is fine)."""
        entries = list(path.parent.glob(f"{path.stem}.*.native"))
        for directory in numba_cache_dirs(path):
            entries += directory.rglob(f"{path.stem}.*")
        for entry in entries:
            try:
                entry.unlink()
            except OSError:
                pass


def _compile_lock(path: Path) -> AbstractContextManager[None]:
    """The cross-process lock of kernel module ``path`` (see the module doc)."""
    return exclusive_lock(path.with_suffix(".lock"))


def _identity(source: str, signature: tuple) -> tuple[str, tuple[str, ...]]:
    """(module digest, signature as type names) that name a kernel in the cache."""
    return (hashlib.sha256(source.encode()).hexdigest()[:_HASH_CHARS],
            tuple(str(t) for t in signature))


def numba_cache_dirs(path: Path) -> list[Path]:
    """Where numba caches the machine code of the kernel module ``path``: beside it in
    ``__pycache__``, or when ``NUMBA_CACHE_DIR`` is set, in the folder numba's
    ``UserProvidedCacheLocator`` names under it (the module folder's name and the SHA-1
    of its absolute path)."""
    dirs = [path.parent / "__pycache__"]
    if os.environ.get("NUMBA_CACHE_DIR"):
        dirs.append(numba_files.cache_dir(path))
    return [d for d in dirs if d.is_dir()]


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


#: the process's kernel cache (its directory: ``SIMACCEL_CACHE_DIR``, read at first use)
DEFAULT_CACHE = KernelCache()
megacache.add_writer("kernel", DEFAULT_CACHE.populate)

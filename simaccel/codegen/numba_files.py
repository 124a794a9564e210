"""numba's own cache files of a kernel module, carried by torch's Mega-Cache.

A kernel that runs in numba's thread pool has no native object (:mod:`.native`): a new
process loads it from numba's cache, an index (``sk_<sha256>.kernel-<line>.py311.nbi``)
and its data (``...1.nbc``). Without those a process that loaded the Mega-Cache compiles
the kernel again. So each numba file of a loaded module is recorded as a ``kernel``
artifact: a one-line JSON header (the file's SHA-256 and the module's modification time in
ns) and the file's bytes. numba's index is stale unless the module file has the same
modification time and size as when the index was written (its "source stamp"), so
writing the artifacts back restores that time on the module.

The data files are pickles numba unpickles, so like a native object they are code: a
file is written only when its bytes hash to its header, into the cache folder numba reads
for the module (private to the user, as the rest of the cache).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

from simaccel.cachedir import ensure_private_dir, write_atomic
from simaccel.guards.dynamo import megacache

log = logging.getLogger("simaccel.codegen")

#: a numba cache file of a kernel module ``sk_<digest>.py``: group 1 is the module's stem
NAME = re.compile(r"(sk_[0-9a-f]+)\.kernel-\d+\.py\d+(?:\.\d+)?\.nb[ic]")


def cache_dir(module: Path) -> Path:
    """The folder numba reads the cache of ``module`` from: beside it in ``__pycache__``,
    or under ``NUMBA_CACHE_DIR`` in numba's ``<folder>_<SHA-1 of its path>``."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        folder = os.path.dirname(os.path.abspath(module))
        digest = hashlib.sha1(folder.encode()).hexdigest()  # noqa: S324 - numba's naming
        return Path(os.environ["NUMBA_CACHE_DIR"]) / f"{os.path.basename(folder)}_{digest}"
    return module.parent / "__pycache__"


def record(module: Path) -> None:
    """Offer every numba cache file of ``module`` to the Mega-Cache."""
    folder = cache_dir(module)
    if not folder.is_dir():
        return
    mtime_ns = module.stat().st_mtime_ns
    for path in sorted(folder.glob(f"{module.stem}.*.nb[ic]")):
        data = path.read_bytes()
        header = json.dumps({"sha256": hashlib.sha256(data).hexdigest(),
                             "module_mtime_ns": mtime_ns})
        megacache.record("kernel", path.name, header.encode() + b"\n" + data)


def populate(root: Path, name: str, content: bytes) -> None:
    """Write the numba file ``name`` an artifact carried into the cache at ``root`` and
    give the module the modification time numba's index expects (now, or when the module
    is written: see :func:`module_mtime`); a damaged artifact is skipped with a warning."""
    match = NAME.fullmatch(name)
    header_line, _, data = content.partition(b"\n")
    try:
        header = json.loads(header_line)
        valid = hashlib.sha256(data).hexdigest() == header["sha256"]
        mtime_ns = int(header["module_mtime_ns"])
    except (ValueError, KeyError, TypeError):
        valid = False
    if match is None or not valid:
        log.warning("simaccel: skipping cache artifact %s: not a whole numba cache file; "
                    "the kernel compiles when needed", name)
        return
    module = root / f"{match[1]}.py"
    write_atomic(ensure_private_dir(cache_dir(module)) / name, data)
    _MTIMES[module.name] = mtime_ns
    if module.exists():
        os.utime(module, ns=(mtime_ns, mtime_ns))


def module_mtime(module_name: str) -> int | None:
    """The modification time (ns) a populated numba index expects of ``module_name``."""
    return _MTIMES.get(module_name)


#: module file name -> the modification time (ns) its populated numba index was made for
_MTIMES: dict[str, int] = {}

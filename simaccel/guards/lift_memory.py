"""Lifting decisions kept between processes: the sources of a frame that must stay
specialized, so that a new process does not pay the re-traces that found them.

A source Dynamo used as a tensor shape or pinned to its value costs the first compile of a
frame one more re-trace (:mod:`simaccel.guards.lift`). The in-process memory
(:func:`simaccel.guards.dynamo.remember_unliftable`) spares later compiles of the frame in
the same process; this file-backed one spares a warm start (a new process with the same
``SIMACCEL_CACHE_DIR``), as the kernel cache spares its kernel compiles. An entry is keyed
by the frame's code (bytecode, names and constants: an edit of the function changes the
key), the torch version and a format number, and holds {source: reason}. An entry can only
keep a source from being lifted: a stale one costs a recompile on a new value, never a
wrong result. Entries this process wrote are not read back: the in-process memory, which
``torch._dynamo.reset()`` clears, speaks for them.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import types
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from simaccel.cachedir import default_cache_dir, private_subdir, write_atomic
from simaccel.guards.dynamo import megacache

log = logging.getLogger("simaccel")

FORMAT = 2  # 2: floats the tensorify pass used to specialize are lifted now
#: keys of the entries this process wrote
_WRITTEN: set[str] = set()
#: code object -> (its key, the entry an earlier process left, read once per process)
_SEEN: weakref.WeakKeyDictionary[types.CodeType, tuple[str, dict[str, str]]] = (
    weakref.WeakKeyDictionary())


def load(code: types.CodeType) -> dict[str, str]:
    """{source: reason} an earlier process recorded for ``code`` ({} if none or unreadable).
    A compile asks more than once (first trace, report): the file is read once."""
    key, entry = _seen(code)
    return {} if key in _WRITTEN else dict(entry)


def populate(name: str, content: bytes) -> None:
    """Write an entry a Mega-Cache artifact carried (``load_cache_artifacts``): only an
    entry file name, and only content that reads as an entry; anything else is skipped
    with a warning (the re-trace finds the decisions again)."""
    try:
        data = json.loads(content.decode("utf-8"))
    except ValueError:
        data = None
    if not _ENTRY_NAME.fullmatch(name) or not _is_entry(data):
        log.warning("simaccel: skipping lifting-memory artifact %r: not an entry", name)
        return
    write_atomic(_path(name[:-len(".json")]), content)


_ENTRY_NAME = re.compile(r"[0-9a-f]{32}\.json")


def store(code: types.CodeType, reasons: Mapping[str, str]) -> None:
    """Add ``reasons`` to ``code``'s entry (a failed write is logged: it only costs a later
    process the re-traces)."""
    key, _ = _seen(code)
    _WRITTEN.add(key)
    path = _path(key)
    merged = {**_read(path), **reasons}
    content = json.dumps(merged, sort_keys=True).encode()
    try:
        write_atomic(path, content)
        megacache.record("lift", path.name, content)
    except OSError as err:
        log.warning("simaccel: cannot record lifting decisions in %s: %s", path, err)


def _is_entry(data: Any) -> bool:
    """True for what an entry file holds: {source: reason}, all strings."""
    return isinstance(data, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items())


def _read(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("simaccel: ignoring unreadable lifting memory %s: %s", path, err)
        return {}
    if not _is_entry(data):
        log.warning("simaccel: ignoring malformed lifting memory %s", path)
        return {}
    return data


def _seen(code: types.CodeType) -> tuple[str, dict[str, str]]:
    found = _SEEN.get(code)
    if found is None:
        key = _key(code)
        found = _SEEN[code] = (key, _read(_path(key)))
        if found[1]:  # an entry a later process may want too
            megacache.record("lift", f"{key}.json",
                             json.dumps(found[1], sort_keys=True).encode())
    return found


def _key(code: types.CodeType) -> str:
    digest = hashlib.sha256(f"torch {torch.__version__}|format {FORMAT}".encode())
    _fingerprint(code, digest)
    return digest.hexdigest()[:32]


def _fingerprint(code: types.CodeType, digest: Any) -> None:
    """Feed what defines ``code`` to ``digest``: the same in every process for the same
    source (``marshal.dumps`` is not: it flags objects by their reference counts)."""
    for part in (code.co_filename, code.co_qualname, code.co_firstlineno, code.co_names,
                 code.co_varnames, code.co_freevars, code.co_cellvars):
        digest.update(repr(part).encode() + b"\0")
    digest.update(code.co_code)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _fingerprint(const, digest)
        elif isinstance(const, frozenset):  # iteration order varies with the hash seed
            digest.update(repr(sorted(map(repr, const))).encode() + b"\0")
        else:
            digest.update(repr(const).encode() + b"\0")


def _path(key: str) -> Path:
    """The entry's file in ``lift/`` of the cache directory (both private to the user)."""
    return private_subdir(default_cache_dir(), "lift") / f"{key}.json"


megacache.add_writer("lift", populate)

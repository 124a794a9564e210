"""Unique names for numba's parallel-loop functions across processes.

numba lowers each ``prange`` loop to a function named ``__numba_parfor_gufunc_<hash>``,
the hash being the loop object's ``id()``: its memory address. simaccel's compile workers
are forked from one process and compile kernels in the same order, so two workers
compiling two different kernels can allocate their loop objects at the same address and
give two different functions one name. The main process then loads both kernels from
numba's cache into one JIT, which resolves the name to whichever was loaded first: the
second kernel runs the first one's loop on its own buffers. Measured: causal
attention's two row kernels (4096 and 2048 rows, compiled by two workers) returned wrong
values for the last 64 rows of every head in 3 of ~10 benchmark runs.

:func:`install` makes the hash ``hash((salt, id(loop)))`` with a random 64-bit salt per
process: still stable for the object's lifetime (numba keeps loops in dicts and sets),
and two processes clash only if their salts and addresses both do.
"""
from __future__ import annotations

import os
import secrets

from numba.parfors.parfor import Parfor

#: this process's salt (workers draw their own: :func:`install` runs at import, and a
#: forked worker reseeds through ``os.register_at_fork``)
_SALT = [secrets.randbits(64)]


def install() -> None:
    """Give numba's parallel loops the salted hash (once per process)."""
    if getattr(Parfor, "_simaccel_salted", False):
        return
    Parfor.__hash__ = _salted_hash  # type: ignore[method-assign,assignment]
    Parfor._simaccel_salted = True  # type: ignore[attr-defined]


def _salted_hash(loop: Parfor) -> int:
    return hash((_SALT[0], id(loop)))


def _reseed() -> None:
    """A forked worker's own salt (it starts with a copy of its parent's)."""
    _SALT[0] = secrets.randbits(64)


os.register_at_fork(after_in_child=_reseed)

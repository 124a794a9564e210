"""One writer at a time for a numba cache index, across processes.

numba saves a newly compiled signature of a ``cache=True`` function by reading the
function's index (``<function>.nbi``: signature -> data file), choosing the first data
file name the index does not use, writing the index back, then writing the data
(``<function>.<n>.nbc``). Two processes saving two signatures of one function at once
both read the same index and both choose ``.1.nbc``: the last index written names one
signature, the last data written may be the other's, and every later process then loads
that code for the wrong argument types. simaccel's compile workers do exactly this when
two of them compile kernels calling one helper of :mod:`.kernel_lib` with different types
on an empty cache (numba issue #10128 reports the same race on GUFunc caches).

:func:`install` makes a save hold an exclusive ``flock`` on ``<index>.lock`` from reading
the index to writing the data, so the second writer reads the first one's index and
picks the next name. Loading is unchanged: a reader that meets an index entry whose data
is not written yet finds no file and compiles, as numba does for any missing entry.
"""
from __future__ import annotations

from typing import Any

from simaccel.cachedir import exclusive_lock


def install() -> None:
    """Make numba's index saves exclusive across processes (once per process; imports
    numba, so the kernel cache calls it when it loads or compiles with numba, never in a
    warm process that runs native kernels only). numba writes a cache only into a folder
    it has checked it can write, so the lock file beside the index can be made."""
    from numba.core.caching import IndexDataCacheFile
    if getattr(IndexDataCacheFile, "_simaccel_locked", False):
        return
    save = IndexDataCacheFile.save

    def locked_save(self: Any, key: Any, data: Any) -> None:
        with exclusive_lock(self._index_path + ".lock"):
            save(self, key, data)
    IndexDataCacheFile.save = locked_save  # type: ignore[method-assign]
    IndexDataCacheFile._simaccel_locked = True  # type: ignore[attr-defined]

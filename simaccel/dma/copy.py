"""How the simulator moves a copy's bytes on this host, and what a copy needs.

The copy runs inline on the calling thread. Splitting a large copy over worker threads
(numpy releases the GIL while copying) was measured and gave nothing on the 2-core
machine: one core already saturates its share of memory bandwidth, and waking a worker
costs more than it saves once the other core is busy. The simulated timing of a
copy is the engine's business and does not depend on how the bytes were moved.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def check_pair(src: np.ndarray, dst: np.ndarray, label: str) -> None:
    """Raise ValueError unless ``src`` can be copied into ``dst``: DMA moves bytes and
    never converts, so both need the same dtype and element count (shapes may differ),
    and ``dst`` must be writeable. ``label`` names the copy in the message."""
    if src.dtype != dst.dtype or src.size != dst.size:
        raise ValueError(f"DMA copy {label!r}: src has {src.size} elements of {src.dtype}, "
                         f"dst has {dst.size} elements of {dst.dtype} (same dtype and element "
                         f"count needed; DMA moves bytes and never converts)")
    if not dst.flags.writeable:
        raise ValueError(f"DMA copy {label!r}: dst is read-only")


def copy_array(src: np.ndarray, dst: np.ndarray, staged: bool = False, label: str = "") -> None:
    """Copy ``src`` into ``dst`` in C order (``dst`` may have another shape with the same
    element count); through a contiguous bounce buffer when ``staged``. Raises as
    :func:`check_pair` does (numpy itself refuses a read-only ``dst``); only the checks the
    copy needs run on its fast path."""
    if src.dtype != dst.dtype:
        check_pair(src, dst, label)
    if staged:
        # The bounce buffer is a contiguous host copy; the device DMA then reads it.
        src = np.ascontiguousarray(src)
    if src.shape == dst.shape:
        # Plain assignment is the cheapest copy numpy has for small arrays; with equal
        # dtypes it never converts, and equal shapes hold equal element counts.
        dst[...] = src
    elif src.size != dst.size:
        check_pair(src, dst, label)
    elif dst.flags.c_contiguous:  # a view of dst: a strided src is gathered once
        dst.reshape(src.shape)[...] = src
    else:
        dst[...] = src.reshape(dst.shape)


def mapped_bytes(host: np.ndarray, staged: bool, label: str, kind: str = "h2d") -> int:
    """Bytes of one mapped access of ``host`` (it moves nothing now): an ``"h2d"`` read the
    device makes in place, or a ``"d2h"`` write a kernel made in place. The device addresses
    a mapped array directly, so there is no bounce buffer to stage or gather a strided
    array, and a write needs a writeable one."""
    if staged or not host.flags.c_contiguous:
        raise ValueError(f"mapped {MAPPED_ACCESS[kind]} {label!r}: the host array must be "
                         f"C-contiguous and not staged")
    if kind == "d2h" and not host.flags.writeable:
        raise ValueError(f"mapped write {label!r}: the host array is read-only")
    return host.nbytes


#: the copy kinds that can be mapped, and what the device does to the host array
MAPPED_ACCESS = {"h2d": "read", "d2h": "write"}


def check_mappable(kind: str) -> None:
    """Raise ValueError unless copies of ``kind`` can be mapped accesses."""
    if kind not in MAPPED_ACCESS:
        raise ValueError(f"only h2d reads and d2h writes can be mapped, got kind {kind!r}")


def copy_plain(srcs: Sequence[np.ndarray], dsts: Sequence[np.ndarray | None],
                labels: Sequence[str], moved: list[tuple[int, bool, bool, Any]]) -> None:
    """Move a batch with nothing staged or mapped (the common call), appending each
    pair's (bytes, staged, mapped, strided) to ``moved`` as it goes."""
    for src, dst, label in zip(srcs, dsts, labels):
        copy_array(src, dst, False, label)  # type: ignore[arg-type]
        moved.append(copied_facts(src, dst, False))  # type: ignore[arg-type]


def copy_each(kind: str, srcs: Sequence[np.ndarray], dsts: Sequence[np.ndarray | None],
               labels: Sequence[str], staged: Sequence[bool] | None,
               mapped: Sequence[bool] | None, moved: list[tuple[int, bool, bool, Any]]) -> None:
    """Move a batch of ``kind`` pair by pair, staging where ``staged`` says and checking
    (not moving) the mapped accesses; appends to ``moved`` as :func:`copy_plain` does."""
    for done, src in enumerate(srcs):
        is_staged = staged is not None and staged[done]
        if mapped is not None and mapped[done]:
            moved.append((mapped_bytes(src, is_staged, labels[done], kind), is_staged,
                          True, None))
            continue
        dst = dsts[done]
        copy_array(src, dst, is_staged, labels[done])  # type: ignore[arg-type]
        moved.append(copied_facts(src, dst, is_staged))  # type: ignore[arg-type]


def copied_facts(src: np.ndarray, dst: np.ndarray, staged: bool) -> tuple[int, bool, bool, Any]:
    """A copied pair's (bytes, staged, mapped, strided source's shape and strides)."""
    return (dst.nbytes, staged, False,
            None if src.flags.c_contiguous else (src.shape, src.strides))

"""How the simulator moves a descriptor's bytes on this host.

The copy runs inline on the calling thread. Splitting a large copy over worker threads
(numpy releases the GIL while copying) was measured and gave nothing on the 2-core
machine: one core already saturates its share of memory bandwidth, and waking a worker
costs more than it saves once the other core is busy. The simulated timing of a
descriptor is the engine's business and does not depend on how the bytes were moved.
"""
from __future__ import annotations

import numpy as np


def copy_array(src: np.ndarray, dst: np.ndarray, staged: bool = False, label: str = "") -> None:
    """Copy ``src`` into ``dst`` in C order (``dst`` may have another shape with the same
    element count); through a contiguous bounce buffer when ``staged``. DMA moves bytes and
    never converts, so the dtypes must be equal."""
    if src.dtype != dst.dtype or src.size != dst.size:
        raise ValueError(f"DMA copy {label!r}: src {src.dtype}[{src.size}] does not match "
                         f"dst {dst.dtype}[{dst.size}] (same dtype and element count needed)")
    if staged:
        # The bounce buffer is a contiguous host copy; the device DMA then reads it.
        src = np.ascontiguousarray(src)
    if src.shape == dst.shape:
        # Plain assignment is the cheapest copy numpy has for small arrays; with equal
        # dtypes it never converts.
        dst[...] = src
    elif dst.flags.c_contiguous:  # a view of dst: a strided src is gathered once
        dst.reshape(src.shape)[...] = src
    else:
        dst[...] = src.reshape(dst.shape)

"""DMA descriptors: one contiguous-or-strided copy from a source array to a destination.

A descriptor is what a driver writes into a DMA ring (Linux ``dma_async_tx_descriptor``,
a Neuron DMA queue entry): where to read, where to write, how many bytes. The engine's
one copy path performs the copy for real (the bytes move) and charges simulated time for
it; a descriptor only checks, when it is made, that its arrays can be copied.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simaccel.dma.copy import check_pair

#: Directions a descriptor can move bytes in.
#: h2d: host -> device, d2h: device -> host, const: host constant bank -> device,
#: d2d: device -> device; collective.d2h / collective.h2d: a gradient bucket leaving the
#: device for a host collective (torch.distributed all-reduce) and coming back.
KINDS: tuple[str, ...] = ("h2d", "d2h", "const", "d2d", "collective.d2h", "collective.h2d")


@dataclass(eq=False, repr=False)
class Descriptor:
    """One DMA copy of ``dst.nbytes`` bytes from ``src`` into ``dst``.

    src: source array; may be non-contiguous (a strided descriptor; its shape and byte
        strides are recorded in ``src_shape`` / ``src_strides``).
    dst: destination array, written in C order; same element count and dtype as ``src``.
    kind: one of :data:`KINDS`.
    label: free text shown in the trace (e.g. the buffer name).
    staged: the copy goes through a host bounce buffer (pinned staging) first; counted
        separately in the engine stats (``staged.*``).
    """

    src: np.ndarray
    dst: np.ndarray
    kind: str
    label: str = ""
    staged: bool = False
    src_shape: tuple[int, ...] = field(init=False)
    src_strides: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Descriptor.kind must be one of {KINDS}, got {self.kind!r}")
        if not isinstance(self.src, np.ndarray) or not isinstance(self.dst, np.ndarray):
            raise TypeError("Descriptor src and dst must be numpy arrays, got "
                            f"{type(self.src).__name__} and {type(self.dst).__name__}")
        check_pair(self.src, self.dst, self.label)  # early; the engine's copy checks again
        self.src_shape = tuple(self.src.shape)
        self.src_strides = tuple(self.src.strides)

    def __repr__(self) -> str:
        return (f"Descriptor({self.kind}, {self.label!r}, {self.nbytes} bytes, "
                f"src_shape={self.src_shape}{', strided' if self.strided else ''}"
                f"{', staged' if self.staged else ''})")

    @property
    def nbytes(self) -> int:
        """Bytes moved by this descriptor (bytes)."""
        return int(self.dst.nbytes)

    @property
    def strided(self) -> bool:
        """True when the source is not C-contiguous (a gather over strides)."""
        return not self.src.flags.c_contiguous

    def bursts(self, burst_bytes: int) -> list[int]:
        """Sizes of the bursts this descriptor is split into (bytes each, last may be short)."""
        full, rest = divmod(self.nbytes, burst_bytes)
        return [burst_bytes] * full + ([rest] if rest else [])


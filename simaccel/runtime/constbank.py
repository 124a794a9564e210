"""The constant bank: a graph's lifted scalars and 0-d inputs in one device buffer.

Each call packs the current values into a host image, compares it with what the
device holds, and issues one host-to-device ``const`` transfer only when something
changed. Every slot is aligned to its own size: an int that fits 32 bits gets a 4-byte
slot (the backend guards that it keeps fitting), floats and wider ints 8 bytes.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from simaccel.errors import SimAccelError


class ConstantBank:
    """Layout and host image of one program's bank. ``slots``: (argument index, buffer
    name, numpy dtype) per scalar, in bank order."""

    def __init__(self, slots: list[tuple[int, str, np.dtype]]):
        self.slots = slots
        self.offsets: list[int] = []
        offset = 0
        for _, _, dtype in slots:
            offset = -(-offset // dtype.itemsize) * dtype.itemsize
            self.offsets.append(offset)
            offset += dtype.itemsize
        self.nbytes = max(-(-offset // 8) * 8, 8)
        self.host = np.zeros(self.nbytes, np.uint8)
        self.valid = False  # the device copy matches ``host``

    def views(self, bank: np.ndarray) -> dict[str, np.ndarray]:
        """Typed 1-element views of each slot in the device bank ``bank`` (uint8)."""
        return {name: bank[off:off + dtype.itemsize].view(dtype)
                for (_, name, dtype), off in zip(self.slots, self.offsets)}

    def pack(self, args: list[Any]) -> bool:
        """Write the call's values into the host image; True if the device must be updated."""
        packed = np.zeros_like(self.host)
        for (index, name, dtype), off in zip(self.slots, self.offsets):
            try:
                value = np.asarray(args[index], dtype=dtype).reshape(1)
            except OverflowError as exc:
                raise SimAccelError(
                    f"scalar input {index} ({name}) = {args[index]} does not fit its "
                    f"{dtype.itemsize * 8}-bit constant-bank slot; the slot guard should have "
                    f"recompiled this graph (please report this)") from exc
            packed[off:off + dtype.itemsize] = value.view(np.uint8)
        if self.valid and np.array_equal(packed, self.host):
            return False
        self.host[:] = packed
        self.valid = True
        return True

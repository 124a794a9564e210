"""The constant bank: a graph's lifted scalars and 0-d inputs in one device buffer.

Each call packs the current values into a host image, compares it with what the
device holds, and issues one host-to-device ``const`` transfer only when something
changed. Every slot is aligned to its own size: an int that fits 32 bits gets a 4-byte
slot (the backend guards that it keeps fitting), floats and wider ints 8 bytes.

A program over dynamic shapes also keeps its size symbols' values in the bank, after the
scalars: one int64 array (the size bank) that kernels read their loop bounds from. A call
at new sizes changes the bank like a new scalar value does, in the same one transfer.
"""
from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from simaccel.errors import SimAccelError
from simaccel.runtime.sizes import tuple_getter


#: the types of the values that are their own key (:func:`_value_key`) but for a zero
_PLAIN_NUMBERS = frozenset({int, float})
#: the DMA label of the constant bank's upload (one descriptor per call that changed it)
BANK_LABEL = "constant bank"


class ConstantBank:
    """Layout and host image of one program's bank. ``slots``: (argument index, buffer
    name, numpy dtype) per scalar, in bank order; ``sizes``: how many size symbols the
    size bank after them holds."""

    def __init__(self, slots: list[tuple[int, str, np.dtype]], sizes: int = 0):
        self.slots = slots
        self.offsets: list[int] = []
        offset = 0
        for _, _, dtype in slots:
            offset = -(-offset // dtype.itemsize) * dtype.itemsize
            self.offsets.append(offset)
            offset += dtype.itemsize
        #: where the size bank starts (bytes, 8-aligned) and how many int64 it holds
        self.sizes_offset = -(-offset // 8) * 8
        self.sizes = sizes
        self.used = bool(slots) or sizes > 0
        offset = self.sizes_offset + 8 * sizes
        self.nbytes = max(-(-offset // 8) * 8, 8)
        self.host = np.zeros(self.nbytes, np.uint8)
        self.valid = False  # the device copy matches ``host``
        self._last: tuple | None = None  # the values ``host`` holds (see _value_key)
        self._indices = [index for index, _, _ in slots]
        #: the call's slot values as one tuple (C-level), and what the last pack saw:
        #: those values, its sizes, and whether they were all Python numbers
        self._values = tuple_getter(self._indices)
        self._last_values: tuple = ()
        self._last_sizes: tuple[int, ...] = ()
        self._plain_last = False
        self._layout = struct.Struct(_struct_format(slots, self.offsets, self.nbytes, sizes,
                                                    self.sizes_offset))

    def views(self, bank: np.ndarray) -> dict[str, np.ndarray]:
        """Typed 1-element views of each slot in the device bank ``bank`` (uint8)."""
        return {name: bank[off:off + dtype.itemsize].view(dtype)
                for (_, name, dtype), off in zip(self.slots, self.offsets)}

    def size_view(self, bank: np.ndarray) -> np.ndarray:
        """The size bank in the device bank ``bank`` (uint8): int64, one per symbol."""
        start = self.sizes_offset
        return bank[start:start + 8 * max(self.sizes, 1)].view(np.int64)

    def pack(self, args: list[Any], sizes: tuple[int, ...] = ()) -> bool:
        """Write the call's values (and its size symbols' values) into the host image;
        True if the device must be updated."""
        raw = self._values(args)
        if self.valid and self._plain_last and raw == self._last_values \
                and sizes == self._last_sizes and 0.0 not in raw:
            # the common case: the Python numbers of the last call (a zero takes the long
            # way, where its sign counts; a NaN never compares equal, so it is re-sent)
            return False
        self._last_values, self._last_sizes = raw, sizes
        self._plain_last = plain = _PLAIN_NUMBERS.issuperset(map(type, raw))
        if plain and 0.0 not in raw:  # Python numbers, no zero: each is its own key
            key = values = raw + sizes
        else:
            key = (*map(_value_key, raw), *sizes)
            values = tuple(k[0] if type(k) is tuple else k for k in key)
        if self.valid and key == self._last:
            return False
        try:
            self._layout.pack_into(self.host, 0, *values)
        except (struct.error, OverflowError) as exc:
            raise self._overflow(values) from exc
        self._last = key
        self.valid = True
        return True

    def _overflow(self, values: list[Any]) -> SimAccelError:
        for (index, name, dtype), value in zip(self.slots, values):
            try:
                if dtype.kind == "f" and isinstance(value, float) and math.isfinite(value) \
                        and abs(value) > np.finfo(dtype).max:  # numpy makes it inf
                    raise OverflowError(value)
                np.asarray(value, dtype=dtype)
            except OverflowError:
                return SimAccelError(
                    f"scalar input {index} ({name}) = {value} does not fit its "
                    f"{dtype.itemsize * 8}-bit constant-bank slot; the slot guard should have "
                    f"recompiled this graph (please report this)")
        return SimAccelError(f"constant bank: cannot pack {values}")


_STRUCT_CODES = {"float64": "d", "float32": "f", "int64": "q", "int32": "i", "int16": "h",
                 "int8": "b", "uint8": "B", "bool": "?"}


def _struct_format(slots: list[tuple[int, str, np.dtype]], offsets: list[int],
                   nbytes: int, sizes: int = 0, sizes_offset: int = 0) -> str:
    """A little-endian struct layout matching the bank's slots, the size bank (``sizes``
    int64s at ``sizes_offset``) and padding."""
    fmt, cursor = "<", 0
    for (_, _, dtype), off in zip(slots, offsets):
        fmt += "x" * (off - cursor) + _STRUCT_CODES[dtype.name]
        cursor = off + dtype.itemsize
    if sizes:
        fmt += "x" * (sizes_offset - cursor) + "q" * sizes
        cursor = sizes_offset + 8 * sizes
    return fmt + "x" * (nbytes - cursor)


def _value_key(value: Any) -> Any:
    """A value's identity for change detection: equal keys mean equal bytes in the bank
    (the sign of a float zero counts; NaN never compares equal, so it is simply re-sent).
    Python ints and non-zero floats (what compiled graphs pass) are their own key."""
    kind = type(value)
    if kind is int or (kind is float and value != 0.0):
        return value
    if isinstance(value, np.ndarray):
        value = value.item()  # a snapshot: the array may be a view the caller writes to
    if isinstance(value, float) and value == 0.0:
        return (value, math.copysign(1.0, value))
    return value

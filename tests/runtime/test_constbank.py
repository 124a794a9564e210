"""The constant bank's change detection: an update is sent exactly when the bytes the
device holds would differ (including the sign of a zero), never skipped wrongly."""
from __future__ import annotations

import struct

import numpy as np

from simaccel.runtime.constbank import ConstantBank


def bank() -> ConstantBank:
    return ConstantBank([(1, "a", np.dtype("float64")), (2, "n", np.dtype("int32"))])


def unpack(b: ConstantBank) -> tuple[float, int]:
    return struct.unpack_from("<di", b.host, 0)


def test_update_only_when_a_value_changes() -> None:
    b = bank()
    assert b.pack([None, 0.5, 3]) is True and unpack(b) == (0.5, 3)
    assert b.pack([None, 0.5, 3]) is False
    assert b.pack([None, 0.75, 3]) is True and unpack(b) == (0.75, 3)
    assert b.pack([None, 0.75, 4]) is True and unpack(b) == (0.75, 4)
    assert b.pack([None, 0.75, 4]) is False


def test_signed_zero_and_nan_are_sent() -> None:
    b = bank()
    assert b.pack([None, 0.0, 1]) is True
    assert b.pack([None, -0.0, 1]) is True  # equal as numbers, different bytes
    assert np.signbit(unpack(b)[0])
    assert b.pack([None, -0.0, 1]) is False
    assert b.pack([None, float("nan"), 1]) is True
    assert np.isnan(unpack(b)[0])


def test_a_zero_d_array_is_read_per_call_not_held() -> None:
    """A 0-d array may be a view the caller writes to between calls: its value is read
    each call, so an in-place change is sent."""
    b = bank()
    value = np.array(1.5)
    assert b.pack([None, value, 2]) is True
    value[()] = 2.5
    assert b.pack([None, value, 2]) is True and unpack(b) == (2.5, 2)
    assert b.pack([None, value, 2]) is False


def test_invalidated_bank_is_resent() -> None:
    b = bank()
    b.pack([None, 0.5, 3])
    b.valid = False  # the device copy was lost (reconfigure)
    assert b.pack([None, 0.5, 3]) is True


def test_size_symbols_share_the_change_detection() -> None:
    """A new size alone is sent; the same values and sizes are not, however the values
    came (Python numbers, then a 0-d array holding the same number, then that array
    changed in place)."""
    b = ConstantBank([(1, "a", np.dtype("float64"))], sizes=1)
    assert b.pack([None, 0.5], (4,)) is True
    assert b.pack([None, 0.5], (4,)) is False
    assert b.pack([None, 0.5], (5,)) is True
    assert struct.unpack_from("<q", b.host, b.sizes_offset) == (5,)
    value = np.array(0.5)
    assert b.pack([None, value], (5,)) is False  # the same bytes
    value[()] = 1.25
    assert b.pack([None, value], (5,)) is True and struct.unpack_from("<d", b.host, 0) == (1.25,)
    assert b.pack([None, 1.25], (5,)) is False

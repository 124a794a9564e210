"""Reading a call's size symbols and keying layouts by them (simaccel.runtime.sizes);
the layout a compiled program picks per call is tested in
tests/backend/test_dynamic_shapes.py."""
from __future__ import annotations

import numpy as np
import pytest

from simaccel.runtime.sizes import SizeFunction, SymbolSource, size_reader


def _general(symbols, args):
    """The per-symbol read the fast reader must agree with."""
    return tuple(src.read(args) for src in symbols)


@pytest.mark.parametrize("symbols", [
    (),
    (SymbolSource("s0", 1),),
    (SymbolSource("s0", 2), SymbolSource("s1", 0)),
    (SymbolSource("s0", 1), SymbolSource("s1", 3, dim=1)),  # a tensor dim: the general read
], ids=["none", "one int", "two ints", "int and tensor dim"])
def test_size_reader_reads_what_each_symbol_source_reads(symbols):
    args = [7, 5, np.int64(-3), np.zeros((2, 9))]
    read = size_reader(symbols)
    assert read(args) == _general(symbols, args)
    assert all(type(v) is int for v in read(args))


def test_size_function_keys_on_the_symbols_its_sizes_read():
    both = SizeFunction(["s0", "s1"], ["s0 * s1", 4])
    only_first = SizeFunction(["s0", "s1"], ["s0 + 1"])
    none = SizeFunction(["s0"], [4, 8])  # an int only kernels read: no size depends on it
    assert both.key((3, 5)) == (3, 5)
    assert only_first.key((3, 5)) == (3,)
    assert none.key((3,)) == () == none.key((11,))
    assert none((11,)) == (4, 8) and only_first((3, 5)) == (4,)

"""Reading a call's size symbols and keying layouts by them (simaccel.runtime.sizes), and
the layout a program picks per call (Layouts.at's same-sizes fast path)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

import simaccel
from simaccel.runtime.layout import Layouts
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


def _scaled_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    return (x * n).sum(-1) + n


def test_a_program_takes_the_layout_of_each_calls_sizes(monkeypatch):
    """A lifted int only kernels read and a dynamic batch: calls alternate between sizes
    and values; each call gets the layout of its own sizes (the same object while they
    repeat), and every result equals eager."""
    picked = []
    at = Layouts.at

    def recording_at(self, sizes):
        layout = at(self, sizes)
        picked.append((sizes, layout))
        return layout

    monkeypatch.setattr(Layouts, "at", recording_at)
    compiled = torch.compile(_scaled_rows, backend="simaccel", dynamic=True)
    calls = [(4, 3), (4, 3), (4, 5), (7, 5), (4, 3), (7, 2), (7, 2)]
    for batch, n in calls:
        x = torch.randn(batch, 16)
        torch.testing.assert_close(compiled(x, n), _scaled_rows(x, n), rtol=1e-5, atol=1e-5)
    assert len(picked) >= len(calls)
    for sizes, layout in picked:
        assert layout.sizes == sizes
    steady = picked[-len(calls):]
    assert steady[0][1] is steady[1][1] and steady[5][1] is steady[6][1]
    assert steady[1][1] is not steady[2][1]
    # dynamic=True: the row width is a symbol too, beside the batch and the int
    assert all(set(c) <= set(s) for (s, _), c in zip(steady, calls))
    assert counters["stats"]["unique_graphs"] == 1  # one graph served every size and value
    stats = simaccel.get_device().runtime_stats()
    assert stats["host_fallback_ops"] == 0 and stats["kernel_launches"] >= len(calls)
    dma = simaccel.get_device().dma_stats()
    assert dma["h2d.bytes"] > 0 and dma["d2h.bytes"] > 0

"""Caching allocator (properties against a reference model) and the device arena."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from simaccel.errors import DeviceOutOfMemoryError, SimAccelError
from simaccel.runtime.memory import (SMALL_SEGMENT_BYTES, Block, CachingAllocator,
                                     DeviceMemory)

KiB, MiB = 1 << 10, 1 << 20


def check_consistent(alloc: CachingAllocator, live: list[Block]) -> None:
    """Blocks tile their segments, live blocks never overlap, stats match the layout."""
    snap = alloc.snapshot()
    stats = alloc.memory_stats()
    seg_ranges = []
    inactive_split = 0
    for seg in snap:
        cursor = seg["offset"]
        for blk in seg["blocks"]:
            assert blk["offset"] == cursor and blk["size"] > 0
            assert blk["offset"] % alloc.alignment == 0 and blk["size"] % alloc.unit == 0
            if not blk["allocated"] and len(seg["blocks"]) > 1:
                inactive_split += blk["size"]
            cursor += blk["size"]
        assert cursor == seg["offset"] + seg["size"]
        seg_ranges.append((seg["offset"], seg["offset"] + seg["size"]))
    seg_ranges.sort()
    for (_, end), (start, _) in zip(seg_ranges, seg_ranges[1:]):
        assert end <= start
    assert all(end <= alloc.capacity_bytes for _, end in seg_ranges)
    spans = sorted((b.offset, b.offset + b.size) for b in live)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, "live blocks overlap"
    assert stats["allocated_bytes.all.current"] == sum(b.size for b in live)
    assert stats["requested_bytes.all.current"] == sum(b.requested for b in live)
    assert stats["allocation.all.current"] == len(live)
    assert stats["reserved_bytes.all.current"] == sum(s["size"] for s in snap)
    assert stats["segment.all.current"] == len(snap)
    assert stats["inactive_split_bytes.all.current"] == inactive_split
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"]
    assert (stats["allocated_bytes.all.allocated"] - stats["allocated_bytes.all.freed"]
            == stats["allocated_bytes.all.current"])


ops = st.lists(st.one_of(
    st.tuples(st.just("malloc"), st.integers(0, 8 * KiB) | st.integers(0, 3 * MiB)),
    st.tuples(st.just("free"), st.integers(0, 1000)),
    st.tuples(st.just("empty_cache"), st.just(0))), max_size=80)


@settings(max_examples=200, deadline=None)
@given(ops=ops, alignment=st.sampled_from([64, 256, 512, 4096]),
       capacity=st.sampled_from([64 * KiB, MiB + 512, 3 * MiB, 8 * MiB + 512]))
def test_random_alloc_free_sequences(ops, alignment, capacity):
    alloc = CachingAllocator(capacity, alignment)
    live: list[Block] = []
    ooms = 0
    for op, arg in ops:
        if op == "malloc":
            try:
                block = alloc.malloc(arg)
            except DeviceOutOfMemoryError as err:
                ooms += 1
                assert err.requested_bytes == arg and err.capacity_bytes == capacity
                assert err.largest_free_block < alloc.round_size(arg)
            else:
                assert block.requested == arg and block.size == alloc.round_size(arg)
                live.append(block)
        elif op == "free" and live:
            alloc.free(live.pop(arg % len(live)))
        elif op == "empty_cache":
            alloc.empty_cache()
        check_consistent(alloc, live)
    assert alloc.memory_stats()["num_ooms"] == ooms
    event(f"ooms>0: {ooms > 0}")
    event(f"max segments: {min(len(alloc.snapshot()), 3)}")
    for block in live:
        alloc.free(block)
    check_consistent(alloc, [])
    # everything freed: each segment coalesced back into one free block
    assert all(len(seg["blocks"]) == 1 for seg in alloc.snapshot())
    alloc.empty_cache()
    stats = alloc.memory_stats()
    assert stats["reserved_bytes.all.current"] == 0 and stats["segment.all.current"] == 0
    assert stats["largest_free_block_bytes"] == capacity // alloc.unit * alloc.unit


def test_rounding_best_fit_split_and_coalesce():
    alloc = CachingAllocator(16 * MiB, 256)
    a = alloc.malloc(1000)  # -> 1024 bytes, carved from a 2 MiB small segment
    assert (a.offset, a.size, a.requested) == (0, 1024, 1000)
    b, c = alloc.malloc(512), alloc.malloc(0)  # zero bytes still gets one 512-byte unit
    assert (b.offset, c.offset, c.size) == (1024, 1536, 512)
    assert alloc.memory_stats()["segment.all.current"] == 1
    alloc.free(b)
    d = alloc.malloc(300)  # best fit reuses b's hole, not the big tail
    assert d.offset == 1024
    for blk in (a, c, d):
        alloc.free(blk)
    assert alloc.snapshot()[0]["blocks"] == [
        {"offset": 0, "size": SMALL_SEGMENT_BYTES, "requested": 0, "allocated": False}]
    big = alloc.malloc(3 * MiB)  # large request: own segment rounded to 2 MiB multiples
    assert big.size == 3 * MiB
    assert alloc.memory_stats()["reserved_bytes.all.current"] == SMALL_SEGMENT_BYTES + 4 * MiB


def test_oom_figures_then_allocator_still_usable():
    alloc = CachingAllocator(1 * MiB, 512)
    held = alloc.malloc(600 * KiB)  # preferred 2 MiB segment does not fit: exact 600 KiB
    cached = alloc.malloc(100 * KiB)
    alloc.free(cached)  # its 100 KiB segment stays cached until the retry releases it
    assert alloc.memory_stats()["reserved_bytes.all.current"] == 700 * KiB
    with pytest.raises(DeviceOutOfMemoryError) as info:
        alloc.malloc(500 * KiB)
    err = info.value
    assert err.requested_bytes == 500 * KiB
    assert err.free_bytes == 1 * MiB - 600 * KiB
    assert err.largest_free_block == 1 * MiB - 600 * KiB
    assert err.capacity_bytes == 1 * MiB
    assert "500" in str(err) or str(500 * KiB) in str(err)
    stats = alloc.memory_stats()
    assert stats["num_ooms"] == 1 and stats["num_alloc_retries"] == 1
    assert stats["reserved_bytes.all.current"] == 600 * KiB  # the retry released the cache
    assert stats["num_device_free"] == 1
    ok = alloc.malloc(400 * KiB)  # still usable after the OOM
    alloc.free(ok)
    alloc.free(held)
    assert alloc.memory_stats()["allocated_bytes.all.current"] == 0


def test_double_free_and_foreign_block():
    alloc, other = CachingAllocator(1 * MiB, 256), CachingAllocator(1 * MiB, 256)
    block = alloc.malloc(100)
    with pytest.raises(SimAccelError, match="not allocated by this allocator"):
        other.free(block)
    alloc.free(block)
    with pytest.raises(SimAccelError, match="double free"):
        alloc.free(block)
    again = alloc.malloc(100)  # same bytes handed out again under a new handle
    assert again.offset == block.offset and again is not block
    with pytest.raises(SimAccelError, match="double free"):
        alloc.free(block)  # a stale handle never frees the new owner's block
    assert again.allocated
    with pytest.raises(SimAccelError):
        alloc.malloc(-1)


def test_peak_reset_summary_and_threads():
    alloc = CachingAllocator(64 * MiB, 256)
    blocks = [alloc.malloc(MiB) for _ in range(4)]
    for blk in blocks:
        alloc.free(blk)
    assert alloc.memory_stats()["allocated_bytes.all.peak"] == 4 * MiB
    alloc.reset_peak_stats()
    assert alloc.memory_stats()["allocated_bytes.all.peak"] == 0
    summary = alloc.memory_summary()
    assert "Allocated memory" in summary and "Reserved memory" in summary
    assert all(len(line) == 77 for line in summary.splitlines())

    def churn() -> None:
        for i in range(300):
            alloc.free(alloc.malloc(512 * (i % 7)))

    workers = [threading.Thread(target=churn) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stats = alloc.memory_stats()
    assert stats["allocation.all.current"] == 0 and stats["allocation.all.allocated"] == 1204
    alloc.reset_accumulated_stats()
    assert alloc.memory_stats()["allocation.all.allocated"] == 0


def test_device_memory_views():
    mem = DeviceMemory(1 << 30)  # 1 GiB of virtual memory; pages untouched
    assert not mem.materialized
    x = mem.view(256, np.float32, 10)
    x[:] = np.arange(10, dtype=np.float32)
    assert mem.materialized and x.dtype == np.float32 and x.shape == (10,)
    np.testing.assert_array_equal(mem.view(256, "float32", 10), np.arange(10))
    assert mem.arena[256:260].view(np.float32)[0] == 0.0
    assert mem.view(1 << 30, np.int64, 0).size == 0
    with pytest.raises(SimAccelError, match="aligned"):
        mem.view(2, np.float32, 1)
    with pytest.raises(SimAccelError, match="outside"):
        mem.view((1 << 30) - 8, np.float64, 2)


def test_device_buffers_are_aligned_in_host_memory():
    """The arena starts on a page, so an offset the allocator aligns is aligned in host
    memory too (numpy alone starts a large array 16 bytes into a page)."""
    for capacity in (1 << 20, (1 << 26) + 64):
        mem = DeviceMemory(capacity)
        assert mem.address % 4096 == 0 and mem.arena.nbytes == capacity
        alloc = CachingAllocator(capacity, 64)
        alloc.malloc(1000)
        block = alloc.malloc(1000)  # the second: a nonzero offset
        assert block.offset > 0
        view = mem.view(block.offset, np.float32, 250)
        assert view.__array_interface__["data"][0] % 64 == 0
        view[:] = 1.0  # the last bytes of the arena are writable, none past it
        mem.view(capacity - 8, np.float64, 1)[:] = 2.0
        assert mem.arena[-8:].view(np.float64)[0] == 2.0

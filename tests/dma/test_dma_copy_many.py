"""copy_many and copy_one (the runtime's per-call path) against submit: same bytes,
timing, stats and trace."""
from __future__ import annotations

import numpy as np
import pytest

from simaccel.dma import Descriptor, DmaEngine


def make_engine() -> DmaEngine:
    # 1 byte/ns, 100 ns latency: a descriptor of N bytes takes exactly 100 + N ns
    return DmaEngine(channels=2, burst_bytes=64, bandwidth_gbps=1.0, latency_ns=100.0)


def pairs(sizes: list[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    srcs = [np.arange(n, dtype=np.uint8) for n in sizes]
    return srcs, [np.zeros(n, np.uint8) for n in sizes]


def comparable(events):
    return [(e.name, e.cat, e.tid, e.start_ns, e.dur_ns, e.args) for e in events]


def test_copy_many_equals_submit_of_one_descriptor_per_pair():
    sizes = [300, 50, 1000]
    staged = [False, True, False]
    by_submit, by_copy_many = make_engine(), make_engine()
    srcs, dsts_a = pairs(sizes)
    done = by_submit.submit([Descriptor(s, d, "h2d", f"in{i}", staged=st)
                             for i, (s, d, st) in enumerate(zip(srcs, dsts_a, staged))],
                            not_before_ns=40.0)
    _, dsts_b = pairs(sizes)
    end = by_copy_many.copy_many("h2d", srcs, dsts_b, ["in0", "in1", "in2"], staged=staged,
                                 not_before_ns=40.0)
    assert end == done.end_ns == 40.0 + 100.0 + 300.0 + 100.0 + 1000.0  # channel 0 queues
    for a, b, s in zip(dsts_a, dsts_b, srcs):
        np.testing.assert_array_equal(a, s)
        np.testing.assert_array_equal(b, s)
    assert by_copy_many.stats() == by_submit.stats()
    assert by_copy_many.stats()["staged.bytes"] == 50
    assert comparable(by_copy_many.trace_events()) == comparable(by_submit.trace_events())


def test_copy_many_records_strided_sources_in_the_trace():
    eng = make_engine()
    host = np.arange(64, dtype=np.float32).reshape(8, 8)
    dst = np.zeros(16, np.float32)
    eng.copy_many("d2h", [host[::2, ::2]], [dst], ["out"])
    np.testing.assert_array_equal(dst, host[::2, ::2].ravel())
    (event,) = eng.trace_events()
    assert event.args["src_shape"] == [4, 4] and event.args["src_strides"] == [64, 8]


def test_copy_many_rejects_bad_kind_and_mismatched_arrays():
    eng = make_engine()
    with pytest.raises(ValueError, match="kind"):
        eng.copy_many("sideways", [], [], [])
    with pytest.raises(ValueError, match="'x'.*element count"):
        eng.copy_many("h2d", [np.zeros(4, np.float32)], [np.zeros(4, np.float64)], ["x"])
    assert eng.stats()["descriptors"] == 0  # nothing was counted for the failed submit
    assert eng.copy_many("h2d", [], [], [], not_before_ns=7.0) == 7.0


def test_copy_into_another_shape_with_the_same_element_count():
    src = np.random.default_rng(0).standard_normal(1001).astype(np.float32)
    dst = np.zeros((7, 143), np.float32)
    eng = make_engine()
    eng.copy_many("h2d", [src], [dst], ["big"])
    np.testing.assert_array_equal(dst.ravel(), src)
    assert eng.stats()["h2d.bytes"] == src.nbytes


def test_a_bad_pair_stops_the_submit_and_what_moved_before_it_is_counted():
    eng = make_engine()
    good_src, good_dst = np.ones(8, np.uint8), np.zeros(8, np.uint8)
    with pytest.raises(ValueError, match="'bad'"):
        eng.copy_many("h2d", [good_src, np.zeros(3, np.uint8)],
                      [good_dst, np.zeros(4, np.uint8)], ["good", "bad"])
    np.testing.assert_array_equal(good_dst, good_src)
    st = eng.stats()
    assert (st["h2d.bytes"], st["h2d.transfers"], st["descriptors"]) == (8, 1, 1)
    assert [e.name for e in eng.trace_events()] == ["h2d good"]


def test_copy_one_equals_copy_many_of_one_pair():
    a, b = make_engine(), make_engine()
    src = np.arange(40, dtype=np.uint8)
    dst_a, dst_b = np.zeros(40, np.uint8), np.zeros(40, np.uint8)
    end_a = a.copy_one("const", src, dst_a, "bank", staged=True, not_before_ns=5.0)
    end_b = b.copy_many("const", [src], [dst_b], ["bank"], staged=[True], not_before_ns=5.0)
    assert end_a == end_b == 5.0 + 100.0 + 40.0
    np.testing.assert_array_equal(dst_a, src)
    assert a.stats() == b.stats()
    assert comparable(a.trace_events()) == comparable(b.trace_events())
    with pytest.raises(ValueError, match="kind"):
        a.copy_one("upward", src, dst_a, "bank")


def test_a_bad_descriptor_stops_the_submit_like_a_bad_pair_stops_copy_many():
    by_submit, by_copy_many = make_engine(), make_engine()
    srcs = [np.ones(8, np.uint8), np.zeros(3, np.uint8)]
    bad = Descriptor(srcs[1], np.zeros(3, np.uint8), "h2d", "bad")
    bad.dst = np.zeros(4, np.uint8)  # made bad after the descriptor checked it
    good_dst = np.zeros(8, np.uint8)
    with pytest.raises(ValueError, match="'bad'") as from_submit:
        by_submit.submit([Descriptor(srcs[0], good_dst, "h2d", "good"), bad])
    with pytest.raises(ValueError, match="'bad'") as from_copy_many:
        by_copy_many.copy_many("h2d", srcs, [np.zeros(8, np.uint8), np.zeros(4, np.uint8)],
                               ["good", "bad"])
    assert str(from_submit.value) == str(from_copy_many.value)
    np.testing.assert_array_equal(good_dst, srcs[0])
    assert by_submit.stats() == by_copy_many.stats()
    assert by_submit.stats()["descriptors"] == 1
    assert comparable(by_submit.trace_events()) == comparable(by_copy_many.trace_events())
    # the cursor moved past the good copy only: the next copy takes channel 1 in both
    assert by_submit.copy_one("h2d", srcs[0], good_dst, "next") == 108.0
    assert by_copy_many.copy_one("h2d", srcs[0], good_dst, "next") == 108.0


def test_a_descriptor_and_copy_many_refuse_a_mismatch_with_one_message():
    src, dst = np.zeros(4, np.float32), np.zeros(4, np.int32)
    with pytest.raises(ValueError) as made:
        Descriptor(src, dst, "h2d", "x")
    with pytest.raises(ValueError) as copied:
        make_engine().copy_many("h2d", [src], [dst], ["x"])
    assert str(made.value) == str(copied.value)
    assert "float32" in str(made.value) and "int32" in str(made.value)

"""Planned batches (``plan_batch`` + ``copy_planned``, the runtime's per-call path) against
copy_many: the same bytes, timeline, stats and trace, with the batch worked out once."""
from __future__ import annotations

import numpy as np
import pytest

from simaccel.dma import DmaEngine


def make_engine(channels: int = 2) -> DmaEngine:
    # 1 byte/ns, 100 ns latency: a descriptor of N bytes takes exactly 100 + N ns
    return DmaEngine(channels=channels, burst_bytes=64, bandwidth_gbps=1.0, latency_ns=100.0)


def comparable(events):
    return [(e.name, e.cat, e.tid, e.start_ns, e.dur_ns, e.args) for e in events]


def batch(sizes: list[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    srcs = [np.arange(n, dtype=np.uint8) * (i + 1) for i, n in enumerate(sizes)]
    return srcs, [np.zeros(n, np.uint8) for n in sizes]


@pytest.mark.parametrize("channels", [1, 2, 3])
def test_a_planned_batch_repeats_copy_many_exactly(channels):
    """Five calls of one batch (5 pairs over the channels, so the round-robin deal starts
    on a different channel each call), with a single copy in between moving the cursor
    and a not-before time that sometimes waits: identical ends, stats and trace."""
    sizes, labels = [300, 50, 1000, 7, 64], ["a", "b", "c", "d", "e"]
    staged = [False, True, False, False, True]
    plain, planned = make_engine(channels), make_engine(channels)
    srcs, dsts = batch(sizes)
    plan = planned.plan_batch("h2d", srcs, dsts, labels, staged=staged)
    for call, not_before in enumerate([0.0, 40.0, 5000.0, 0.0, 12000.0]):
        srcs = [s + call for s in srcs]
        out_plain, out_planned = batch(sizes)[1], batch(sizes)[1]
        end_plain = plain.copy_many("h2d", srcs, out_plain, labels, staged=staged,
                                    not_before_ns=not_before)
        end_planned = planned.copy_planned(plan, srcs, out_planned, not_before_ns=not_before)
        assert end_planned == end_plain
        for a, b, s in zip(out_plain, out_planned, srcs):
            np.testing.assert_array_equal(a, s)
            np.testing.assert_array_equal(b, s)
        for eng in (plain, planned):
            eng.copy_one("d2h", srcs[0], out_plain[0], "between")
    assert planned.stats() == plain.stats()
    assert planned.stats()["staged.bytes"] == 5 * (50 + 64)
    assert comparable(planned.trace_events()) == comparable(plain.trace_events())


def test_mapped_reads_and_strided_sources_plan_as_they_copy():
    host = np.arange(64, dtype=np.float32).reshape(8, 8)
    mapped_src = np.arange(32, dtype=np.float32)
    srcs = [host[::2, ::2], mapped_src]
    plain, planned = make_engine(), make_engine()
    outs = [np.zeros(16, np.float32), None]
    plan = planned.plan_batch("h2d", srcs, outs, ["strided", "mapped"], mapped=[False, True])
    plain.copy_many("h2d", srcs, [np.zeros(16, np.float32), None], ["strided", "mapped"],
                    mapped=[False, True])
    planned.copy_planned(plan, srcs, outs)
    np.testing.assert_array_equal(outs[0], host[::2, ::2].ravel())
    assert planned.stats() == plain.stats()
    assert planned.stats()["h2d.mapped_bytes"] == mapped_src.nbytes
    events = planned.trace_events()
    assert comparable(events) == comparable(plain.trace_events())
    assert events[0].args["src_strides"] == [64, 8] and events[1].args["mapped"]


def test_a_bad_pair_stops_a_planned_batch_and_what_moved_before_it_is_counted():
    eng = make_engine()
    srcs, dsts = batch([8, 4])
    plan = eng.plan_batch("h2d", srcs, dsts, ["good", "bad"])
    fresh = [np.zeros(8, np.uint8), np.zeros(4, np.uint8)]
    with pytest.raises(ValueError, match="'bad'.*float32"):
        eng.copy_planned(plan, srcs, [fresh[0], np.zeros(1, np.float32)])
    np.testing.assert_array_equal(fresh[0], srcs[0])
    st = eng.stats()
    assert (st["h2d.bytes"], st["h2d.transfers"], st["descriptors"]) == (8, 1, 1)
    assert [e.name for e in eng.trace_events()] == ["h2d good"]
    with pytest.raises(ValueError, match="'bad'.*planned for 4"):
        eng.copy_planned(plan, srcs, [fresh[0], np.zeros(5, np.uint8)[:5]])
    # the engine stays usable: the next planned call moves everything
    assert eng.copy_planned(plan, srcs, dsts) > 0
    np.testing.assert_array_equal(dsts[1], srcs[1])


def test_a_plan_is_refused_by_an_engine_of_other_timing_or_with_other_pair_counts():
    srcs, dsts = batch([8])
    plan = make_engine().plan_batch("d2h", srcs, dsts, ["x"])
    with pytest.raises(ValueError, match="make the plan again"):
        make_engine(channels=3).copy_planned(plan, srcs, dsts)
    with pytest.raises(ValueError, match="1 pairs, got 2"):
        make_engine().copy_planned(plan, srcs * 2, dsts * 2)
    with pytest.raises(ValueError, match="kind"):
        make_engine().plan_batch("sideways", srcs, dsts, ["x"])
    with pytest.raises(ValueError, match="only h2d reads and d2h writes"):
        make_engine().plan_batch("d2d", srcs, dsts, ["x"], mapped=[True])

"""Call plans (``plan_call`` + ``record_call``: a whole program call placed as one record)
against the same batches placed with copy_planned and the same kernels scheduled one by
one: the same timeline, stats and trace."""
from __future__ import annotations

import numpy as np
import pytest

from simaccel.dma import DmaEngine


def make_engine(channels: int = 2, max_trace_events: int = 100_000) -> DmaEngine:
    # 1 byte/ns, 100 ns latency: a descriptor of N bytes takes exactly 100 + N ns
    return DmaEngine(channels=channels, burst_bytes=64, bandwidth_gbps=1.0, latency_ns=100.0,
                     max_trace_events=max_trace_events)


def comparable(events):
    return [(e.name, e.cat, e.tid, e.start_ns, e.dur_ns, e.args) for e in events]


def pairs(sizes: list[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    return ([np.arange(n, dtype=np.uint8) for n in sizes], [np.zeros(n, np.uint8) for n in sizes])


KERNELS, DURATIONS = ("k0", "k1", "k2"), (250.0, 0.1, 1000.3)


def one_by_one(eng: DmaEngine, plans: dict, batches: dict, not_before: float, ready: float,
               with_const: bool) -> float:
    """What the runtime did before call plans: each batch placed as it moved, each kernel
    scheduled as it ran."""
    end = eng.copy_planned(plans["h2d"], *batches["h2d"], not_before_ns=not_before)
    if with_const:
        end = max(end, eng.copy_planned(plans["const"], *batches["const"],
                                        not_before_ns=not_before))
    end = max(end, ready, not_before)
    for name, duration in zip(KERNELS, DURATIONS):
        end = eng.schedule_compute(name, duration, end)[1]
    return eng.copy_planned(plans["d2h"], *batches["d2h"], not_before_ns=end)


@pytest.mark.parametrize("channels", [1, 2, 3])
def test_a_recorded_call_places_traces_and_counts_like_its_items_one_by_one(channels):
    """Six calls, with and without a constant-bank upload, a kernel-ready time that
    sometimes waits, and a single copy between calls moving the channel cursor."""
    batches = {"h2d": pairs([300, 50, 1000]), "const": pairs([64]), "d2h": pairs([7, 900])}
    labels = {"h2d": ["a", "b", "c"], "const": ["constant bank"], "d2h": ["out0", "out1"]}
    stepwise, recorded = make_engine(channels), make_engine(channels)
    plans = {eng: {kind: eng.plan_batch(kind, *batches[kind], labels[kind])
                   for kind in batches} for eng in (stepwise, recorded)}
    mine = plans[recorded]
    calls = {const: recorded.plan_call([mine["h2d"], *([mine["const"]] if const else [])],
                                       KERNELS, DURATIONS, mine["d2h"])
             for const in (False, True)}
    for call, (not_before, ready) in enumerate([(0, 0), (40, 0), (0, 9000), (5000, 0),
                                                (0, 0), (0, 30000)]):
        with_const = call % 2 == 1
        want = one_by_one(stepwise, plans[stepwise], batches, not_before, ready, with_const)
        for kind in ("h2d", *(["const"] if with_const else []), "d2h"):
            recorded.move_batch(mine[kind], *batches[kind])
        got = recorded.record_call(calls[with_const], not_before, ready)
        assert got == want
        for eng in (stepwise, recorded):
            eng.copy_one("d2h", batches["h2d"][0][0], np.zeros(300, np.uint8), "between")
    want_stats, got_stats = stepwise.stats(), recorded.stats()
    assert got_stats.pop("compute_ns") == pytest.approx(want_stats.pop("compute_ns"))
    assert got_stats == want_stats
    assert got_stats["compute_items"] == 18 and got_stats["const.transfers"] == 3
    assert comparable(recorded.trace_events()) == comparable(stepwise.trace_events())


def test_a_call_with_no_kernels_or_no_download_and_empty_batches():
    """The pieces a program with host steps records (uploads alone, a download alone) and
    a batch with no pairs (every output empty) place as their items would."""
    stepwise, recorded = make_engine(), make_engine()
    srcs, dsts = pairs([100, 20])
    for eng in (stepwise, recorded):
        up = eng.plan_batch("h2d", srcs, dsts, ["x", "y"])
        empty = eng.plan_batch("d2h", [], [], [])
        if eng is stepwise:
            end = eng.copy_planned(up, srcs, dsts, not_before_ns=10.0)
            eng.copy_planned(empty, [], [], not_before_ns=end)
            assert eng.copy_planned(up, srcs, dsts, not_before_ns=end) == 410.0
        else:
            end = eng.record_call(eng.plan_call([up], [], [], None), 10.0)
            eng.record_call(eng.plan_call([], [], [], empty), end)
            assert eng.record_call(eng.plan_call([], [], [], up), end) == 410.0
    assert recorded.stats() == stepwise.stats()
    assert comparable(recorded.trace_events()) == comparable(stepwise.trace_events())


def test_the_trace_ring_drops_whole_calls_and_counts_their_spans():
    eng = make_engine(max_trace_events=10)
    srcs, dsts = pairs([8, 8])
    call = eng.plan_call([eng.plan_batch("h2d", srcs, dsts, ["a", "b"])], KERNELS, DURATIONS,
                         None)
    for _ in range(3):  # 5 spans a call: the ring of 10 keeps the newest two calls
        eng.record_call(call)
    events = eng.trace_events()
    assert [e.name for e in events] == ["h2d a", "h2d b", *KERNELS] * 2
    assert eng.chrome_trace()["otherData"]["dropped_events"] == 5
    eng.reset_stats()
    assert eng.trace_events() == [] and eng.stats()["compute_items"] == 0


def test_a_call_plan_is_refused_by_an_engine_of_other_timing_or_bad_kernels():
    srcs, dsts = pairs([8])
    eng = make_engine()
    plan = eng.plan_batch("h2d", srcs, dsts, ["x"])
    with pytest.raises(ValueError, match="make the plan again"):
        make_engine(channels=3).plan_call([plan], [], [], None)
    with pytest.raises(ValueError, match="make the plan again"):
        make_engine(channels=3).record_call(eng.plan_call([plan], [], [], None))
    with pytest.raises(ValueError, match="one duration per kernel"):
        eng.plan_call([], ["k"], [], None)
    with pytest.raises(ValueError, match=">= 0 ns"):
        eng.plan_call([], ["k"], [-1.0], None)


@pytest.mark.parametrize("channels", [1, 3])
def test_calls_recorded_later_place_trace_and_count_as_recorded_at_once(channels):
    """``record_call_later`` holds the calls until the engine places anything else or is
    read: interleaved with single copies (which place the held calls first) and read at
    the end, the timeline, counters and trace equal ``record_call``'s, call by call."""
    batches = {"h2d": pairs([300, 50, 1000]), "const": pairs([64]), "d2h": pairs([7, 900])}
    labels = {"h2d": ["a", "b", "c"], "const": ["constant bank"], "d2h": ["out0", "out1"]}
    at_once, later = make_engine(channels), make_engine(channels)
    calls = {}
    for eng in (at_once, later):
        plans = {kind: eng.plan_batch(kind, *batches[kind], labels[kind]) for kind in batches}
        calls[eng] = [eng.plan_call([plans["h2d"], *([plans["const"]] if const else [])],
                                    KERNELS, DURATIONS, plans["d2h"]) for const in (0, 1)]
    for step, ready in enumerate([0, 0, 9000, 0, 30000, 0, 0]):
        at_once.record_call(calls[at_once][step % 2], ready_ns=ready)
        later.record_call_later(calls[later][step % 2], ready_ns=ready)
        if step % 3 == 2:
            for eng in (at_once, later):
                eng.copy_one("d2h", batches["h2d"][0][0], np.zeros(300, np.uint8), "between")
    assert later.now_ns == at_once.now_ns
    assert later.stats() == at_once.stats()
    assert comparable(later.trace_events()) == comparable(at_once.trace_events())


def test_a_loop_never_reading_the_engine_holds_a_bounded_number_of_calls():
    from simaccel.dma.engine import PENDING_CALLS_MAX
    eng = make_engine()
    srcs, dsts = pairs([100])
    call = eng.plan_call([eng.plan_batch("h2d", srcs, dsts, ["x"])], KERNELS, DURATIONS, None)
    for _ in range(3 * PENDING_CALLS_MAX + 5):
        eng.record_call_later(call)
        assert len(eng._pending) < PENDING_CALLS_MAX
    assert eng.stats()["compute_items"] == 3 * (3 * PENDING_CALLS_MAX + 5)
    assert not eng._pending

"""DMA engine: exact simulated timing, stats counts, and that the bytes really move."""
from __future__ import annotations

import numpy as np
import pytest

from simaccel.dma import Descriptor, DmaEngine

# 1 byte/ns with 100 ns latency: a descriptor of N bytes takes exactly 100 + N ns.
LATENCY_NS = 100.0
BW_GBPS = 1.0


def make_engine(channels: int = 2, burst_bytes: int = 1024) -> DmaEngine:
    return DmaEngine(channels=channels, burst_bytes=burst_bytes,
                     bandwidth_gbps=BW_GBPS, latency_ns=LATENCY_NS)


def h2d(nbytes: int, label: str = "", **kw) -> Descriptor:
    src = np.arange(nbytes, dtype=np.uint8)
    return Descriptor(src, np.zeros(nbytes, np.uint8), "h2d", label, **kw)


def test_two_channels_run_in_parallel():
    eng = make_engine(channels=2)
    done = eng.submit([h2d(1000), h2d(500)])
    (a, b) = done.timings
    assert (a.channel, a.start_ns, a.end_ns) == (0, 0.0, 1100.0)
    assert (b.channel, b.start_ns, b.end_ns) == (1, 0.0, 600.0)
    assert done.end_ns == 1100.0 and done.wait() == 1100.0 and done.done
    assert eng.now_ns == 1100.0
    assert eng.stats()["busy_ns"] == 1700.0


def test_same_channel_is_in_order_and_round_robin_persists():
    eng = make_engine(channels=2)
    first = eng.submit([h2d(1000), h2d(1000), h2d(200)])
    # third descriptor wraps to channel 0 and queues behind the first one
    assert [t.channel for t in first.timings] == [0, 1, 0]
    assert first.timings[2].start_ns == 1100.0 and first.end_ns == 1400.0
    # the cursor continues on channel 1 (free at 1100), gated by not_before_ns
    second = eng.submit([h2d(100)], not_before_ns=1200.0)
    assert second.timings[0].channel == 1
    assert (second.start_ns, second.end_ns) == (1200.0, 1400.0)
    third = eng.submit([h2d(100)], not_before_ns=50.0)  # channel 0, busy until 1400
    assert (third.start_ns, third.end_ns) == (1400.0, 1600.0)


def test_burst_split_transfer():
    eng = make_engine(channels=1, burst_bytes=1024)
    done = eng.submit([h2d(2500)])  # bursts of 1024 + 1024 + 452
    assert done.timings[0].bursts == 3
    assert done.end_ns == LATENCY_NS + 2500.0  # latency once, bursts back to back
    assert h2d(2500).bursts(1024) == [1024, 1024, 452]
    st = eng.stats()
    assert st["bursts"] == 3 and st["descriptors"] == 1
    assert eng.descriptor_time_ns(2500) == 2600.0


def test_compute_track_is_serial_and_overlaps_dma():
    eng = make_engine(channels=1)
    copy = eng.submit([h2d(900)])  # 0 .. 1000
    assert eng.schedule_compute("k0", 500.0, copy.end_ns) == (1000.0, 1500.0)
    assert eng.schedule_compute("k1", 100.0, 0.0) == (1500.0, 1600.0)
    eng.submit([h2d(0)], not_before_ns=1000.0)  # DMA overlaps the kernel
    assert eng.channel_free_ns(0) == 1100.0
    st = eng.stats()
    assert st["compute_ns"] == 600.0 and st["timeline_ns"] == 1600.0 == eng.now_ns


def test_stats_count_transfers_per_submit_and_kind():
    eng = make_engine(channels=4)
    dev = np.zeros(64, np.float32)
    eng.submit([h2d(16), h2d(32), h2d(8)])
    eng.submit([Descriptor(np.ones(64, np.float32), dev, "const"),
                Descriptor(dev, np.zeros(64, np.float32), "d2h", staged=True)])
    eng.submit([Descriptor(dev[:32], np.zeros(32, np.float32), "d2d")])
    st = eng.stats()
    assert (st["h2d.transfers"], st["h2d.bytes"]) == (1, 56)
    assert (st["const.transfers"], st["const.bytes"]) == (1, 256)
    assert (st["d2h.transfers"], st["d2h.bytes"]) == (1, 256)
    assert (st["staged.transfers"], st["staged.bytes"]) == (1, 256)
    assert (st["d2d.transfers"], st["d2d.bytes"]) == (1, 128)
    assert st["descriptors"] == 6
    eng.reset_stats()
    st = eng.stats()
    assert all(v == 0 for v in st.values()), st
    assert eng.now_ns == 0.0 and eng.trace_events() == []


def test_strided_source_really_copied():
    host = np.arange(48, dtype=np.float64).reshape(6, 8)
    src = host[::2, 1::3]  # non-contiguous gather
    dst = np.full(src.size, -1.0)
    desc = Descriptor(src, dst, "h2d", "x")
    assert desc.strided and desc.src_shape == (3, 3) and desc.src_strides == (128, 24)
    assert desc.nbytes == 72
    make_engine().submit([desc])
    np.testing.assert_array_equal(dst, src.ravel())
    # staged path (through a bounce buffer) moves the same bytes
    dst2 = np.zeros((3, 3))
    make_engine().submit([Descriptor(src, dst2, "d2h", staged=True)])
    np.testing.assert_array_equal(dst2, src)


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="bogus"), "kind"),
    (dict(dst=np.zeros(3, np.uint8)), "elements"),
    (dict(dst=np.zeros(4, np.int8)), "dtype"),
])
def test_descriptor_validation(kwargs, match):
    args = dict(src=np.zeros(4, np.uint8), dst=np.zeros(4, np.uint8), kind="h2d")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        Descriptor(**args)


@pytest.mark.parametrize("kwargs", [dict(channels=0), dict(burst_bytes=0),
                                    dict(bandwidth_gbps=0.0), dict(latency_ns=-1.0)])
def test_engine_validation(kwargs):
    args = dict(channels=1, burst_bytes=1, bandwidth_gbps=1.0, latency_ns=0.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        DmaEngine(**args)


def test_empty_submit_and_threads():
    import threading

    eng = make_engine(channels=3)
    assert eng.submit([], not_before_ns=5.0).end_ns == 5.0
    workers = [threading.Thread(target=lambda: [eng.submit([h2d(10)]) for _ in range(200)])
               for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    st = eng.stats()
    assert st["h2d.transfers"] == 800 and st["h2d.bytes"] == 8000
    assert st["busy_ns"] == pytest.approx(800 * 110.0)


def test_a_submit_mixing_kinds_is_placed_in_order_and_counts_one_transfer_per_kind():
    eng = make_engine(channels=2)
    f32 = np.ones(2, np.float32)
    done = eng.submit([h2d(16, "a"), Descriptor(np.ones(32, np.uint8), np.zeros(32, np.uint8),
                                                "const", "bank", staged=True),
                       h2d(8, "b", staged=True), h2d(0, "empty"),
                       Descriptor(f32, np.zeros(2, np.float32), "d2h", "out", staged=True)])
    assert [(t.channel, t.start_ns, t.end_ns) for t in done.timings] == [
        (0, 0.0, 116.0), (1, 0.0, 132.0), (0, 116.0, 224.0), (1, 132.0, 232.0),
        (0, 224.0, 332.0)]
    st = eng.stats()
    assert (st["h2d.transfers"], st["h2d.bytes"]) == (1, 24)  # a, b and empty: one transfer
    assert (st["const.transfers"], st["const.bytes"]) == (1, 32)
    assert (st["d2h.transfers"], st["d2h.bytes"]) == (1, 8)
    assert (st["staged.transfers"], st["staged.bytes"]) == (3, 48)  # one per kind that staged
    assert (st["descriptors"], st["bursts"]) == (5, 4)
    assert [e.name for e in eng.trace_events()] == [
        "h2d a", "const bank", "h2d b", "h2d empty", "d2h out"]

"""Mapped accesses (copy_many with ``mapped``): the device reads host memory in place
(h2d), or a kernel wrote it in place (d2h). Same channels, timing, bursts and counters as a
copy of the same bytes, marked as mapped in the stats and the trace, and no byte copied."""
from __future__ import annotations

import numpy as np
import pytest

import simaccel.dma.copy as copy_module
from simaccel.dma import DmaEngine


def make_engine() -> DmaEngine:
    # 1 byte/ns, 100 ns latency: a descriptor of N bytes takes exactly 100 + N ns
    return DmaEngine(channels=2, burst_bytes=64, bandwidth_gbps=1.0, latency_ns=100.0)


def spans(eng: DmaEngine) -> list[tuple]:
    return [(e.cat, e.tid, e.start_ns, e.dur_ns, e.args["bytes"], e.args["bursts"])
            for e in eng.trace_events()]


def map_reads(eng: DmaEngine, srcs: list, labels: list[str], not_before_ns: float = 0.0
              ) -> float:
    """One submit of mapped reads only."""
    return eng.copy_many("h2d", srcs, [None] * len(srcs), labels, mapped=[True] * len(srcs),
                         not_before_ns=not_before_ns)


def test_mapped_reads_time_and_count_like_a_copy_of_the_same_bytes(monkeypatch):
    sizes = [300, 50, 1000]
    srcs = [np.arange(n, dtype=np.uint8) for n in sizes]
    copied, mapped = make_engine(), make_engine()
    end_copy = copied.copy_many("h2d", srcs, [np.zeros(n, np.uint8) for n in sizes],
                                ["a", "b", "c"], not_before_ns=40.0)

    def no_copy(*args):
        raise AssertionError("a mapped read copied bytes")
    monkeypatch.setattr(copy_module, "copy_array", no_copy)
    end_map = map_reads(mapped, srcs, ["a", "b", "c"], not_before_ns=40.0)

    assert end_map == end_copy == 40.0 + 100.0 + 300.0 + 100.0 + 1000.0  # channel 0 queues
    want, got = copied.stats(), mapped.stats()
    assert (got["h2d.mapped_bytes"], got["h2d.mapped_reads"]) == (sum(sizes), 3)
    assert (want["h2d.mapped_bytes"], want["h2d.mapped_reads"]) == (0, 0)
    for key in ("h2d.bytes", "h2d.transfers", "descriptors", "bursts", "busy_ns",
                "timeline_ns"):
        assert got[key] == want[key], key
    assert got["h2d.transfers"] == 1  # one submit
    assert spans(mapped) == spans(copied)
    events = mapped.trace_events()
    assert [e.name for e in events] == ["h2d a (mapped)", "h2d b (mapped)", "h2d c (mapped)"]
    assert all(e.args["mapped"] is True for e in events)
    assert not any("mapped" in e.args for e in copied.trace_events())


def test_mapped_reads_share_one_submit_with_copies():
    eng = make_engine()
    srcs = [np.arange(200, dtype=np.uint8), np.arange(64, dtype=np.uint8)]
    dst = np.zeros(64, np.uint8)
    end = eng.copy_many("h2d", srcs, [None, dst], ["mapped_in", "copied_in"],
                        mapped=[True, False])
    np.testing.assert_array_equal(dst, srcs[1])  # the copy still moves its bytes
    st = eng.stats()
    assert (st["h2d.bytes"], st["h2d.transfers"], st["descriptors"]) == (264, 1, 2)
    assert (st["h2d.mapped_bytes"], st["h2d.mapped_reads"]) == (200, 1)
    assert end == 100.0 + 200.0  # the two channels run in parallel: the longer one ends last
    assert [e.name for e in eng.trace_events()] == ["h2d mapped_in (mapped)", "h2d copied_in"]


def test_mapped_reads_reject_strided_sources_other_kinds_and_staging():
    eng = make_engine()
    strided = np.arange(64, dtype=np.float32).reshape(8, 8)[:, ::2]
    with pytest.raises(ValueError, match="'x'.*C-contiguous"):
        map_reads(eng, [strided], ["x"])
    with pytest.raises(ValueError, match="only h2d reads and d2h writes"):
        eng.copy_many("const", [np.zeros(4)], [None], ["y"], mapped=[True])
    with pytest.raises(ValueError, match="'z'.*not staged"):
        eng.copy_many("h2d", [np.zeros(4)], [None], ["z"], staged=[True], mapped=[True])
    st = eng.stats()
    assert (st["descriptors"], st["h2d.mapped_reads"], st["h2d.bytes"]) == (0, 0, 0)
    assert eng.trace_events() == []


def test_reset_zeroes_the_mapped_counters():
    eng = make_engine()
    assert map_reads(eng, [np.ones(128, np.uint8)], ["m"]) == 100.0 + 128.0
    assert eng.stats()["h2d.mapped_bytes"] == 128
    eng.reset_stats()
    st = eng.stats()
    assert (st["h2d.mapped_bytes"], st["h2d.mapped_reads"], st["h2d.bytes"]) == (0, 0, 0)
    assert map_reads(eng, [], [], not_before_ns=9.0) == 9.0


def test_mapped_writes_time_and_count_like_a_d2h_copy_of_the_same_bytes(monkeypatch):
    """A kernel that updated host memory in place: its d2h write is placed and counted as
    the copy back of the same bytes would be, in d2h.mapped_bytes/d2h.mapped_writes."""
    sizes = [256, 64]
    hosts = [np.arange(n, dtype=np.uint8) for n in sizes]
    copied, mapped = make_engine(), make_engine()
    end_copy = copied.copy_many("d2h", hosts, [np.zeros(n, np.uint8) for n in sizes],
                                ["p", "q"])
    monkeypatch.setattr(copy_module, "copy_array", lambda *a: pytest.fail("copied"))
    end_map = mapped.copy_many("d2h", hosts, [None, None], ["p", "q"], mapped=[True, True])
    assert end_map == end_copy == 100.0 + 256.0
    want, got = copied.stats(), mapped.stats()
    assert (got["d2h.mapped_bytes"], got["d2h.mapped_writes"]) == (320, 2)
    assert (got["h2d.mapped_bytes"], want["d2h.mapped_writes"]) == (0, 0)
    for key in ("d2h.bytes", "d2h.transfers", "descriptors", "bursts", "timeline_ns"):
        assert got[key] == want[key], key
    assert [e.name for e in mapped.trace_events()] == ["d2h p (mapped)", "d2h q (mapped)"]


def test_a_mapped_write_needs_a_writeable_host_array():
    eng = make_engine()
    frozen = np.zeros(8, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="mapped write 'w'.*read-only"):
        eng.copy_many("d2h", [frozen], [None], ["w"], mapped=[True])
    assert eng.stats()["d2h.mapped_writes"] == 0

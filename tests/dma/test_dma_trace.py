"""Chrome trace export: valid JSON that Perfetto / chrome://tracing can load."""
from __future__ import annotations

import json

import numpy as np

from simaccel.dma import DmaEngine, Descriptor


def test_chrome_trace_is_valid_json_with_required_fields(tmp_path):
    eng = DmaEngine(channels=2, burst_bytes=256, bandwidth_gbps=2.0, latency_ns=1000.0)
    done = eng.submit([Descriptor(np.ones(1024, np.uint8), np.zeros(1024, np.uint8),
                                  "h2d", "input0"),
                       Descriptor(np.ones(512, np.uint8), np.zeros(512, np.uint8), "const")])
    eng.schedule_compute("add_kernel", 3000.0, done.end_ns, args={"flops": 10})
    path = tmp_path / "trace.json"
    eng.export_chrome_trace(path)
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ns"
    events = trace["traceEvents"]
    names = {e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"DMA channel 0", "DMA channel 1", "compute"}
    spans = [e for e in events if e["ph"] == "X"]
    for e in spans:
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= e.keys()
        assert isinstance(e["ts"], float) and isinstance(e["dur"], float)
    copy = next(e for e in spans if e["name"] == "h2d input0")
    assert copy["args"]["bytes"] == 1024 and copy["args"]["bursts"] == 4
    assert copy["ts"] == 0.0 and copy["dur"] == 1.512  # (1000 + 1024 / 2) ns in us
    kernel = next(e for e in spans if e["cat"] == "compute")
    assert kernel["tid"] == 2 and kernel["ts"] == 1.512 and kernel["dur"] == 3.0
    assert kernel["args"] == {"flops": 10}


def test_trace_ring_is_bounded():
    eng = DmaEngine(channels=1, burst_bytes=64, bandwidth_gbps=1.0, latency_ns=0.0,
                    max_trace_events=5)
    for i in range(8):
        eng.schedule_compute(f"k{i}", 1.0)
    events = eng.trace_events()
    assert [e.name for e in events] == ["k3", "k4", "k5", "k6", "k7"]
    assert eng.chrome_trace()["otherData"]["dropped_events"] == 3
    eng.reset_stats()
    eng.schedule_compute("k8", 1.0)
    assert eng.chrome_trace()["otherData"]["dropped_events"] == 0


def test_a_submit_is_one_ring_entry_invisible_to_the_garbage_collector():
    """copy_many records its batch as one entry of plain tuples (spans made when read),
    and the ring bound counts spans: a batch that no longer fits is dropped whole."""
    import gc

    import numpy as np
    eng = DmaEngine(channels=2, burst_bytes=64, bandwidth_gbps=1.0, latency_ns=0.0,
                    max_trace_events=7)
    srcs = [np.arange(8, dtype=np.float32) + i for i in range(3)]
    dsts = [np.empty(8, np.float32) for _ in srcs]
    for _ in range(3):
        eng.copy_many("h2d", srcs, dsts, ["a", "b", "c"])
    events = eng.trace_events()
    assert [e.name for e in events] == ["h2d a", "h2d b", "h2d c"] * 2
    assert [e.tid for e in events[:3]] == [1, 0, 1]  # the round robin goes on across submits
    assert events[0].args["bytes"] == 32
    assert eng.chrome_trace()["otherData"]["dropped_events"] == 3
    for _ in range(3):  # a collection untracks one level of nested tuples
        gc.collect()
    assert not any(gc.is_tracked(entry) for entry in eng._trace._events)

"""The collective-overlap figure and merged traces, on a device timeline built by hand."""
from __future__ import annotations

import numpy as np
import pytest

from simaccel.distributed.overlap import collective_overlap, merge_traces
from simaccel.dma import KINDS
from simaccel.runtime.config import DeviceConfig
from simaccel.runtime.device import Device


def _device() -> Device:
    return Device(DeviceConfig(dma_channels=2, dma_bandwidth_gbps=1.0, dma_latency_ns=0.0))


def test_collective_kinds_are_counted_on_their_own() -> None:
    assert {"collective.d2h", "collective.h2d"} <= set(KINDS)
    device = _device()
    src, dst = np.arange(250, dtype=np.float32), np.zeros(250, np.float32)
    device.dma.copy_one("collective.d2h", src, dst, "grad bucket 0")
    np.testing.assert_array_equal(dst, src)
    stats = device.dma_stats()
    assert stats["collective.d2h.bytes"] == 1000 and stats["collective.d2h.transfers"] == 1
    assert stats["d2h.bytes"] == 0


def test_overlap_is_the_share_of_collective_time_under_kernels() -> None:
    device = _device()
    device.dma.schedule_compute("backward kernel", 400.0, 0.0)  # compute 0..400 ns
    buf = np.zeros(250, np.float32)  # 1000 bytes at 1 byte/ns: 1000 ns
    device.dma.copy_one("collective.d2h", buf, buf.copy(), "bucket", not_before_ns=200.0)
    device.dma.schedule_compute("next kernel", 100.0, 1000.0)  # 1000..1100 ns
    figures = collective_overlap(device)
    assert figures["collective_ns"] == pytest.approx(1000.0)
    assert figures["hidden_ns"] == pytest.approx(200.0 + 100.0)
    assert figures["hidden_fraction"] == pytest.approx(0.3)


def test_no_collective_traffic_is_zero_hidden() -> None:
    assert collective_overlap(_device())["hidden_fraction"] == 0.0


def test_merged_trace_has_a_process_per_rank() -> None:
    traces = []
    for rank in (0, 1):
        device = _device()
        device.rank = rank
        device.dma.schedule_compute("k", 10.0)
        traces.append(device.dma.chrome_trace(**device.trace_process()))
        assert device.runtime_stats()["rank"] == rank
    merged = merge_traces(traces)
    pids = {e["pid"] for e in merged["traceEvents"]}
    assert pids == {1, 2}
    names = {e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"}
    assert names == {"simaccel device (rank 0)", "simaccel device (rank 1)"}

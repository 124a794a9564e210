"""DeviceConfig validation: every bad field raises InvalidOptionError naming the field."""
from __future__ import annotations

import pytest

from simaccel.errors import InvalidOptionError
from simaccel.runtime.config import DeviceConfig


@pytest.mark.parametrize("field, value", [
    ("memory_bytes", 0), ("memory_bytes", -1), ("alignment", 0), ("dma_channels", 0),
    ("dma_burst_bytes", -4096), ("dma_bandwidth_gbps", 0.0), ("dma_bandwidth_gbps", -1.0),
    ("device_flops", 0.0), ("device_mem_gbps", -5.0), ("dma_latency_ns", -1.0),
    ("kernel_launch_ns", -0.5), ("const_bank_bytes", -1),
])
def test_non_positive_values_rejected(field, value):
    with pytest.raises(InvalidOptionError, match=f"DeviceConfig.{field}"):
        DeviceConfig(**{field: value})


@pytest.mark.parametrize("alignment", [3, 6, 100, 255])
def test_alignment_must_be_power_of_two(alignment):
    with pytest.raises(InvalidOptionError, match="alignment.*power of two"):
        DeviceConfig(alignment=alignment)


@pytest.mark.parametrize("field, value", [
    ("dma_channels", 2.5), ("memory_bytes", 1e6), ("alignment", True),
    ("dma_bandwidth_gbps", "fast"), ("dma_latency_ns", float("nan")),
    ("device_flops", float("inf")),
])
def test_wrong_types_and_non_finite_rejected(field, value):
    with pytest.raises(InvalidOptionError, match=field):
        DeviceConfig(**{field: value})


def test_valid_configs_and_replace():
    cfg = DeviceConfig()
    assert cfg.alignment == 64 and cfg.dma_channels == 4
    zero_ok = DeviceConfig(dma_latency_ns=0.0, kernel_launch_ns=0.0, const_bank_bytes=0)
    assert zero_ok.dma_latency_ns == 0.0
    small = cfg.replace(memory_bytes=64 << 20, alignment=64)
    assert small.memory_bytes == 64 << 20 and small.key() != cfg.key()
    with pytest.raises(InvalidOptionError, match="memory_bytes"):
        DeviceConfig(memory_bytes=128, alignment=256)
    with pytest.raises(InvalidOptionError, match="unknown DeviceConfig field.*bogus"):
        cfg.replace(bogus=1)
    with pytest.raises(InvalidOptionError, match="alignment"):
        cfg.replace(alignment=12)

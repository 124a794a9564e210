"""The simulated device's configuration.

Defaults model a PCIe Gen4 x16 attached accelerator: four DMA channels sharing
about 25 GB/s, ~1.5 us latency per descriptor, and a compute unit described by a
roofline (peak FLOP/s and device-memory bandwidth).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from simaccel.errors import InvalidOptionError


@dataclass(frozen=True)
class DeviceConfig:
    """Fields of the simulated device.

    memory_bytes: size of the device arena (bytes).
    alignment: alignment of every device allocation and of direct DMA (bytes, power of two;
        64 = a cache line, which is also what the PyTorch CPU allocator guarantees).
    dma_channels: number of independent DMA channels, each an in-order queue.
    dma_burst_bytes: a transfer is split into bursts of at most this many bytes.
    dma_bandwidth_gbps: bandwidth of one DMA channel (GB/s = bytes/ns).
    dma_latency_ns: fixed cost of one descriptor (ns).
    device_flops: peak compute of the device (FLOP/s) for the roofline model.
    device_mem_gbps: device-memory bandwidth for the roofline model (GB/s).
    kernel_launch_ns: fixed cost of one kernel launch (ns).
    const_bank_bytes: largest constant tensor (bytes) kept in a graph's constant bank.
    host_map_min_bytes: a per-call tensor input of at least this many bytes that only one
        kernel reads is mapped into the device address space (zero-copy, like CUDA mapped
        pinned memory): the kernel reads it in place across the bus instead of the runtime
        copying it into device memory first (bytes; 0 disables mapping). Outputs as
        well. 256 KiB: re-pointing a bound launch at a call's new host array costs
        ~3.5 us, copying 256 KiB ~5 us (``np.copyto``, 2-core machine; 1 MiB: 23 us).
    """

    memory_bytes: int = 1 << 30
    alignment: int = 64
    dma_channels: int = 4
    dma_burst_bytes: int = 64 << 10
    dma_bandwidth_gbps: float = 6.25
    dma_latency_ns: float = 1500.0
    device_flops: float = 10e12
    device_mem_gbps: float = 400.0
    kernel_launch_ns: float = 2000.0
    const_bank_bytes: int = 4096
    host_map_min_bytes: int = 256 << 10

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidOptionError(
                    f"DeviceConfig.{field.name} must be a number, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise InvalidOptionError(
                    f"DeviceConfig.{field.name} must be finite, got {value!r}")
            if field.name in _NON_NEGATIVE:
                if value < 0:
                    raise InvalidOptionError(
                        f"DeviceConfig.{field.name} must be >= 0, got {value!r}")
            elif value <= 0:
                raise InvalidOptionError(
                    f"DeviceConfig.{field.name} must be positive, got {value!r}")
            if field.type in ("int", int) and not isinstance(value, int):
                raise InvalidOptionError(
                    f"DeviceConfig.{field.name} must be an integer, got {value!r}")
        if self.alignment & (self.alignment - 1):
            raise InvalidOptionError(
                f"DeviceConfig.alignment must be a power of two, got {self.alignment}")
        if self.memory_bytes < self.alignment:
            raise InvalidOptionError(
                f"DeviceConfig.memory_bytes ({self.memory_bytes}) must be at least "
                f"alignment ({self.alignment})")

    def replace(self, **fields) -> "DeviceConfig":
        """A copy with ``fields`` changed; unknown names raise :class:`InvalidOptionError`."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise InvalidOptionError(
                f"unknown DeviceConfig field(s) {unknown}; valid fields: {sorted(known)}")
        return dataclasses.replace(self, **fields)

    def key(self) -> tuple:
        """A hashable identity of this config (compiled programs are specialised on it)."""
        return dataclasses.astuple(self)


_NON_NEGATIVE = {"dma_latency_ns", "kernel_launch_ns", "const_bank_bytes",
                 "host_map_min_bytes"}

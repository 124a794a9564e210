"""The simulated device: memory arena, caching allocator, DMA engine, stats.

One process-wide :class:`Device` (``simaccel.get_device()``). ``simaccel.configure``
replaces its config; compiled programs notice the new generation and re-upload what
they keep resident.
"""
from __future__ import annotations

import threading
import weakref
from collections import Counter
from typing import Any

from simaccel.dma import DmaEngine
from simaccel.runtime.config import DeviceConfig
from simaccel.runtime.memory import CachingAllocator, DeviceMemory

#: runtime counters that always appear in runtime_stats(), even when zero.
RUNTIME_KEYS = ("kernel_launches", "host_fallback_ops", "graphs_compiled", "kernels_compiled",
                "kernel_cache_hits", "kernel_memory_hits", "calls", "replayed_calls",
                "resident_uploads", "resident_bytes", "kernel_wall_ns", "size_readbacks",
                "derived_operands", "derived_operand_bytes")


class CallCounts:
    """One program's call counters: its calls, how many of them were replayed
    (:mod:`simaccel.runtime.replay`), their kernel launches and the host wall time those
    kernels took (ns). The program adds to them under its own lock (its calls
    are serialised anyway), so a call counts without taking the device's lock; the device
    adds every program's counts up when its stats are read, and keeps a program's counts
    when the program is gone (:meth:`Device.retire_call_counts`)."""

    __slots__ = ("calls", "replayed_calls", "kernel_launches", "kernel_wall_ns")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls = self.replayed_calls = self.kernel_launches = self.kernel_wall_ns = 0

    def items(self) -> tuple[tuple[str, int], ...]:
        return (("calls", self.calls), ("replayed_calls", self.replayed_calls),
                ("kernel_launches", self.kernel_launches),
                ("kernel_wall_ns", self.kernel_wall_ns))


class Device:
    """A simulated accelerator. Thread safe."""

    def __init__(self, config: DeviceConfig | None = None):
        self._lock = threading.RLock()
        self._counters: Counter[str] = Counter()
        self._programs: weakref.WeakSet[Any] = weakref.WeakSet()
        #: the call counters of the programs alive (see CallCounts)
        self._call_counts: list[CallCounts] = []
        self.generation = 0
        #: this process's rank in a torch.distributed job (None outside one); set by
        #: :mod:`simaccel.distributed` when a DDP job uses the device
        self.rank: int | None = None
        self._build(config or DeviceConfig())
        #: serialises kernel launches: one compute queue, and numba's default
        #: workqueue threading layer is not safe under concurrent parallel kernels.
        self.compute_lock = threading.Lock()

    def _build(self, config: DeviceConfig) -> None:
        self.config = config
        self.memory = DeviceMemory(config.memory_bytes)
        self.allocator = CachingAllocator(config.memory_bytes, config.alignment)
        self.dma = DmaEngine(config.dma_channels, config.dma_burst_bytes,
                             config.dma_bandwidth_gbps, config.dma_latency_ns)
        self.generation += 1

    def reconfigure(self, config: DeviceConfig) -> None:
        """Install ``config``: a new arena, allocator and DMA engine (stats carry over)."""
        with self._lock:
            if config == self.config:
                return
            old_dma = self.dma.stats()
            self._build(config)
            self._counters.update({f"dma_prev.{k}": v for k, v in old_dma.items()
                                   if isinstance(v, (int, float))})

    # ------------------------------------------------------------------ programs

    def register_program(self, program: Any) -> None:
        """Track a program so its workspace can be reclaimed under memory pressure."""
        with self._lock:
            self._programs.add(program)

    def programs(self) -> list[Any]:
        """The programs loaded on this device and still alive (for tools and tests)."""
        with self._lock:
            return list(self._programs)

    def release_idle_workspaces(self, keep: Any = None) -> int:
        """Ask every idle program (but ``keep``) to free its workspace; returns bytes freed."""
        with self._lock:
            programs = [p for p in self._programs if p is not keep]
        freed = sum(p.release_workspace() for p in programs)
        if freed:
            self.allocator.empty_cache()
        return freed

    def unload_programs(self) -> int:
        """Free the device memory of every idle program (each re-uploads what it needs at
        its next call) and empty the allocator's cache; returns the bytes the programs
        freed."""
        with self._lock:
            programs = list(self._programs)
        freed = sum(p.unload() for p in programs)
        self.allocator.empty_cache()
        return freed

    # ------------------------------------------------------------------ counters

    def call_counts(self) -> CallCounts:
        """New call counters for a program (:class:`CallCounts`), added up in
        :meth:`runtime_stats` while the program lives."""
        counts = CallCounts()
        with self._lock:
            self._call_counts.append(counts)
        return counts

    def retire_call_counts(self, counts: CallCounts) -> None:
        """A program is gone: keep its counts in the device's own counters."""
        with self._lock:
            self._call_counts.remove(counts)
            for key, value in counts.items():
                self._counters[key] += value

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counters[key] += n

    def runtime_stats(self) -> dict[str, int]:
        """Counters: ``kernel_launches``, ``host_fallback_ops``, ``graphs_compiled``,
        ``kernels_compiled`` (numba compiled), ``kernel_cache_hits`` (loaded from the
        on-disk cache), ``kernel_memory_hits`` (reused in this process), ``calls``,
        ``replayed_calls`` (those that replayed their binding's recorded call),
        ``derived_operands`` / ``derived_operand_bytes`` (device copies library kernels
        made of resident inputs: a reordered GEMM weight)..."""
        with self._lock:
            stats = {k: 0 for k in RUNTIME_KEYS}
            stats.update({k: v for k, v in self._counters.items() if not k.startswith("dma_prev.")})
            for counts in self._call_counts:
                for key, value in counts.items():
                    stats[key] += value
            if self.rank is not None:
                stats["rank"] = self.rank
            return stats

    def dma_stats(self) -> dict[str, Any]:
        """DMA counters since the last reset (bytes, transfers, descriptors, ns)."""
        with self._lock:
            stats = dict(self.dma.stats())
            for key, value in self._counters.items():
                if key.startswith("dma_prev."):
                    name = key[len("dma_prev."):]
                    if name in stats and isinstance(stats[name], (int, float)):
                        stats[name] += value
            return stats

    def memory_stats(self) -> dict[str, int]:
        """Allocator stats with ``torch.cuda.memory_stats`` key names (bytes)."""
        return self.allocator.memory_stats()

    def memory_summary(self) -> str:
        return self.allocator.memory_summary()

    def reset_stats(self) -> None:
        """Zero the runtime and DMA counters and the memory peaks."""
        with self._lock:
            self._counters.clear()
            for counts in self._call_counts:
                counts.reset()
            self.dma.reset_stats()
            self.allocator.reset_peak_stats()
            if hasattr(self.allocator, "reset_accumulated_stats"):
                self.allocator.reset_accumulated_stats()

    def export_trace(self, path: str) -> None:
        """Write the simulated timeline as Chrome trace JSON (loads in Perfetto); in a
        distributed job its process is the rank's (pid ``rank + 1``)."""
        self.dma.export_chrome_trace(path, **self.trace_process())

    def trace_process(self) -> dict[str, Any]:
        """The pid and process name this device's trace events carry."""
        if self.rank is None:
            return {}
        return {"pid": self.rank + 1, "process_name": f"simaccel device (rank {self.rank})"}

    def kernel_time_ns(self, flops: float, nbytes: float) -> float:
        """Roofline time of a kernel (ns): launch cost + max(compute, memory) time."""
        cfg = self.config
        compute_ns = flops / cfg.device_flops * 1e9
        memory_ns = nbytes / cfg.device_mem_gbps
        return cfg.kernel_launch_ns + max(compute_ns, memory_ns)


_DEVICE: Device | None = None
_DEVICE_LOCK = threading.Lock()


def get_device() -> Device:
    """The process-wide simulated device."""
    global _DEVICE
    if _DEVICE is None:
        with _DEVICE_LOCK:
            if _DEVICE is None:
                _DEVICE = Device()
    return _DEVICE


class configure:
    """Change the device config: ``simaccel.configure(memory_bytes=64 << 20)``.

    Also a context manager that restores the previous config on exit. Unknown or
    invalid fields raise :class:`~simaccel.errors.InvalidOptionError`.
    """

    def __init__(self, **fields: Any):
        device = get_device()
        self._previous = device.config
        device.reconfigure(device.config.replace(**fields))

    def __enter__(self) -> DeviceConfig:
        return get_device().config

    def __exit__(self, *exc: Any) -> None:
        get_device().reconfigure(self._previous)

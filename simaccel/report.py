"""Compile reports: one per compiled graph, readable with ``str(report)``."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

_REPORTS: list["CompileReport"] = []
_LOCK = threading.Lock()
#: reports kept in memory (oldest dropped first).
MAX_REPORTS = 1000


@dataclass
class CompileReport:
    """What simaccel did with one graph: kernels, host fallbacks, memory plan, guards."""

    graph: str
    kernels: list[Any] = field(default_factory=list)
    host_fallbacks: list[tuple[str, str]] = field(default_factory=list)
    memory_plan: dict[str, int] = field(default_factory=dict)
    guards: Any = None  # simaccel.guards report (lifted / dropped / kept / added)
    compile_ms: float = 0.0
    ops: int = 0
    #: how Dynamo calls a forward graph: directly, or through AOTAutograd's runtime wrapper
    #: and why ("" for backward graphs and graphs compiled for training)
    call_path: str = ""
    #: how a forward graph reached ATen: traced once by simaccel, or by AOTAutograd and why
    #: (:func:`simaccel.guards.dynamo.compile_inference_once`); "" for training graphs
    capture: str = ""
    #: (argument index, buffer, bytes) of each input a kernel reads in place from host
    #: memory instead of a copy in device memory (``DeviceConfig.host_map_min_bytes``)
    host_mapped: list[tuple[int, str, int]] = field(default_factory=list)
    #: (output position, buffer, bytes) of each output its kernel writes in place in the
    #: caller's host memory instead of a device buffer copied back
    host_mapped_outputs: list[tuple[int, str, int]] = field(default_factory=list)
    #: the size symbols the graph takes at call time (dynamic shapes), and the guards on
    #: them that compiling it added to the frame's shape env (a size the device code had
    #: to decide a fact about: each is a recompile condition, like Dynamo's own)
    size_symbols: list[str] = field(default_factory=list)
    size_guards: list[str] = field(default_factory=list)
    #: under DistributedDataParallel: the DDPOptimizer split this graph is and where its
    #: gradient buckets are all-reduced (:func:`simaccel.backend.ddp_note`)
    ddp: str = ""
    #: milliseconds of each of simaccel's compile phases for this graph
    #: (:data:`simaccel.timers.GRAPH_PHASES`; ``kernels``: numba compiles and cache loads)
    phases_ms: dict[str, float] = field(default_factory=dict)
    #: a graph with data-dependent sizes: its device stages and host steps, in order
    #: (:mod:`simaccel.staged`; each device stage has a report of its own)
    stages: list[str] = field(default_factory=list)
    #: rewrites of the frame's graph before AOTAutograd, one line each (a hand-written
    #: attention made one SDPA call: :mod:`simaccel.attention_rewrite`)
    rewrites: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.render(list_kernels=True)

    def summary(self) -> str:
        """The report without the per-kernel list."""
        return self.render(list_kernels=False)

    def render(self, list_kernels: bool = True) -> str:
        lines = [f"simaccel compile report: {self.graph}",
                 f"  aten ops: {self.ops}, kernels: {len(self.kernels)}, "
                 f"compile: {self.compile_ms:.1f} ms"]
        if self.phases_ms:
            lines.append("  compile phases: " + ", ".join(
                f"{name} {ms:.1f} ms" for name, ms in self.phases_ms.items()))
        origins: dict[str, int] = {}
        for k in self.kernels:
            origins[k.origin] = origins.get(k.origin, 0) + 1
        if origins:
            lines.append("  kernel sources: " + ", ".join(f"{v} {k}" for k, v in sorted(origins.items())))
        for k in self.kernels if list_kernels else ():
            lines.append(f"    {k.name} [{k.kind}, {k.origin}]")
        if self.host_fallbacks:
            lines.append(f"  host fallbacks ({len(self.host_fallbacks)}):")
            lines += [f"    {op}: {reason}" for op, reason in self.host_fallbacks]
        else:
            lines.append("  host fallbacks: none")
        if self.call_path:
            lines.append(f"  call path: {self.call_path}")
        if self.capture:
            lines.append(f"  ATen capture: {self.capture}")
        if self.memory_plan:
            mp = self.memory_plan
            lines.append(f"  memory plan: planned peak {mp.get('planned_bytes', 0)} bytes, "
                         f"liveness lower bound {mp.get('lower_bound_bytes', 0)} bytes, "
                         f"naive sum {mp.get('naive_bytes', 0)} bytes")
        if self.host_mapped:
            mapped = [f"input {i} ({name}, {nbytes} bytes)" for i, name, nbytes in self.host_mapped]
            lines.append("  host-mapped inputs (read, or updated, in place: not copied): "
                         + ", ".join(mapped))
        if self.host_mapped_outputs:
            mapped = [f"output {k} ({name}, {nbytes} bytes)"
                      for k, name, nbytes in self.host_mapped_outputs]
            lines.append("  host-mapped outputs (written in place: not copied back): "
                         + ", ".join(mapped))
        if self.size_symbols:
            lines.append("  dynamic sizes (read from the constant bank): " + ", ".join(self.size_symbols))
        if self.size_guards:
            lines.append("  size guards added by this compile: " + ", ".join(self.size_guards))
        if self.stages:
            lines.append("  staged program (data-dependent sizes):")
            lines += [f"    {stage}" for stage in self.stages]
        if self.rewrites:
            lines.append("  graph rewrites: " + "; ".join(self.rewrites))
        if self.ddp:
            lines.append(f"  DDP: {self.ddp}")
        if self.guards is not None:
            lines.append(str(self.guards))
        return "\n".join(lines)


def add_report(report: CompileReport) -> None:
    with _LOCK:
        _REPORTS.append(report)
        del _REPORTS[:-MAX_REPORTS]


def reports() -> list[CompileReport]:
    """Reports of the graphs compiled so far in this process (oldest first)."""
    with _LOCK:
        return list(_REPORTS)


def clear_reports() -> None:
    with _LOCK:
        _REPORTS.clear()

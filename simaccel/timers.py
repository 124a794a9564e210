"""Where compile time goes: phase timers in the style of ``torch._dynamo.utils.compile_times()``.

simaccel times its own phases of every graph it compiles (:data:`GRAPH_PHASES`): expanding
the layer norms AOTAutograd kept whole (:mod:`simaccel.layer_norm`), lowering the ATen graph to kernel IR, planning the inputs, the kernels (a numba compile, or a
load from the kernel cache), assembling the program spec, and loading it (memory
planning). Each graph's report has them (``CompileReport.phases_ms``);
:func:`compile_times` sums them over the process and adds the frame-level phases Dynamo
measures itself (its bytecode trace, AOTAutograd around simaccel's compilers, building
guards), so one table says which part of a first call to speed up.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: simaccel's phases of one graph's compile, in pipeline order
GRAPH_PHASES = ("decompose", "lower", "plan inputs", "kernels", "assemble", "load")

_LOCK = threading.Lock()
_TOTALS: dict[str, list[float]] = {}


class PhaseTimer:
    """The phase times (ms) of one graph's compile; each phase is also added to the
    process totals :func:`compile_times` reports."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, (time.perf_counter() - start) * 1e3)

    def add(self, name: str, ms: float) -> None:
        """Add ``ms`` to phase ``name`` (a phase measured elsewhere)."""
        self.ms[name] = self.ms.get(name, 0.0) + ms
        with _LOCK:
            _TOTALS.setdefault(name, []).append(ms / 1e3)


def compile_times(aggregate: bool = True) -> dict[str, float | list[float]]:
    """Seconds per compile phase in this process: simaccel's (:data:`GRAPH_PHASES`) and
    Dynamo's frame-level ones (``dynamo trace``, ``aot_autograd``: AOTAutograd's own
    time around simaccel's compilers, ``build guards``). ``aggregate``: the sum of each
    phase, else every measurement (one per graph or frame)."""
    from simaccel.guards import dynamo
    with _LOCK:
        ours = {name: list(values) for name, values in _TOTALS.items()}
    frame = dynamo.frame_compile_seconds()
    own_total = sum(sum(v) for v in ours.values())
    if frame.get("aot_autograd"):
        # Dynamo's AOTAutograd timer includes the compilers it called: simaccel's phases
        aot = sum(frame["aot_autograd"]) - own_total
        frame["aot_autograd"] = [max(aot, 0.0)]
    merged = {**frame, **{name: ours[name] for name in GRAPH_PHASES if name in ours}}
    return {k: sum(v) for k, v in merged.items()} if aggregate else merged


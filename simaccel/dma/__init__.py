"""Layer 1: a simulated DMA engine (descriptors, channels, timing, completions, trace).

Imports only numpy and the standard library; knows nothing of torch or the runtime.
"""
from __future__ import annotations

from simaccel.dma.clock import SimClock
from simaccel.dma.descriptor import KINDS, Descriptor
from simaccel.dma.engine import (COMPUTE_TRACK, Completion, DescriptorTiming, DmaEngine,
                                 channel_track)
from simaccel.dma.trace import TraceEvent, TraceRecorder

__all__ = [
    "COMPUTE_TRACK", "KINDS", "Completion", "Descriptor", "DescriptorTiming", "DmaEngine",
    "SimClock", "TraceEvent", "TraceRecorder", "channel_track",
]

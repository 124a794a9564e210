"""Every backend test starts from a fresh Dynamo cache, cleared Dynamo counters and zeroed
device statistics, so recompile counts and kernel/DMA figures are the test's own."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import simaccel


@pytest.fixture(autouse=True)
def fresh_compile_state():
    torch._dynamo.reset()
    counters.clear()
    simaccel.get_device().reset_stats()
    yield
    torch._dynamo.reset()

"""Every model test starts from a fresh Dynamo (no compiled frames, no frame state, no
automatic-dynamic memory), cleared counters and zeroed device statistics."""
from __future__ import annotations

import pathlib
import sys

import pytest
import torch
from torch._dynamo.utils import counters

_HERE = str(pathlib.Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import simaccel  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_compile_state():
    torch._dynamo.reset()
    counters.clear()
    simaccel.clear_reports()
    simaccel.get_device().reset_stats()
    yield
    torch._dynamo.reset()
    counters.clear()

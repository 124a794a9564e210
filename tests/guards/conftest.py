"""Shared fixtures for the guards tests: a clean Dynamo per test and a lifting backend."""
from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

_ROOT = str(pathlib.Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from simaccel.guards import GuardReport, lift_scalars  # noqa: E402


@pytest.fixture(autouse=True)
def clean_dynamo() -> Iterator[None]:
    """Each test starts with no compiled frames, no frame state and zeroed counters."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()


class LiftingBackend:
    """A minimal CompilerFn: lift scalars, record the report, run the FX graph as is.

    ``calls`` counts backend invocations (first traces and re-traces alike).
    """

    def __init__(self, lift: object = "auto", keep: object = ()) -> None:
        self.lift = lift
        self.keep = keep
        self.reports: list[GuardReport] = []
        self.graphs: list[torch.fx.GraphModule] = []
        self.example_inputs: list[list[Any]] = []
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        self.calls += 1
        report = lift_scalars(gm, example_inputs, lift=self.lift, keep=self.keep)
        self.reports.append(report)
        self.graphs.append(gm)
        self.example_inputs.append(list(example_inputs))
        return gm.forward

    @property
    def report(self) -> GuardReport:
        """The report of the only graph compiled."""
        assert len(self.reports) == 1, [str(r) for r in self.reports]
        return self.reports[0]


@pytest.fixture
def lifting_backend() -> LiftingBackend:
    return LiftingBackend()


def unique_graphs() -> int:
    """Graphs Dynamo compiled since the last reset (1 = no recompile)."""
    return counters["stats"]["unique_graphs"]

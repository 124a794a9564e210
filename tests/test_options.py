"""Backend options: simaccel/options.py validates them (the one place), and a single
pattern string works wherever a list of patterns does."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import simaccel
from simaccel.errors import InvalidOptionError
from simaccel.options import Options, parse_options

#: a global the compiled function reads: Dynamo's source name for it is G['TEMPERATURE'].
TEMPERATURE = 0.7


@pytest.mark.parametrize("options,expected", [
    (None, Options()),
    ({"lift": "auto"}, Options(lift="auto")),
    ({"lift": "off"}, Options(lift="off")),
    ({"lift": "G['TEMPERATURE']"}, Options(lift=("G['TEMPERATURE']",))),
    ({"lift": " L['self'].scale "}, Options(lift=("L['self'].scale",))),
    ({"lift": ["L['a']", "G['B']"]}, Options(lift=("L['a']", "G['B']"))),
    ({"lift": ()}, Options(lift=())),
    ({"keep": "L['a']"}, Options(keep=("L['a']",))),
    ({"keep": ("L['self'].*",)}, Options(keep=("L['self'].*",))),
    ({"fallback": "error", "guards": []}, Options(fallback="error")),
])
def test_valid_options(options, expected) -> None:
    assert parse_options(options) == expected


@pytest.mark.parametrize("options,needle", [
    ({"lift": None}, "option 'lift' must be 'auto', 'off', a source pattern"),
    ({"lift": 5}, "option 'lift' must be"),
    ({"lift": {"L['a']"}}, "or a list of them"),
    ({"lift": "on"}, "also takes 'auto' or 'off'"),
    ({"lift": "AUTO"}, "written lift='auto' or lift='off'"),
    ({"lift": ["off"]}, "not in a list"),
    ({"lift": ["L['a']", "oops"]}, "malformed source pattern 'oops'"),
    ({"keep": 3}, "option 'keep' must be a source pattern"),
    ({"keep": [1]}, "keep: pattern 1 is not a non-empty string"),
    ({"keep": ["L[a]"]}, "keep: malformed source pattern"),
    ({"fallback": "maybe"}, "option 'fallback' must be one of"),
    ({"guards": "n"}, "option 'guards' must be a list"),
    ({"tier0": "yes"}, "option 'tier0' must be True, False or \"only\""),
    ({"fusion": "max"}, "unknown simaccel option(s) ['fusion']"),
])
def test_bad_options_raise_naming_the_option(options, needle) -> None:
    with pytest.raises(InvalidOptionError) as info:
        parse_options(options)
    assert needle in str(info.value)


def _probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits / TEMPERATURE, dim=-1)


def _run_temperatures(options: dict) -> tuple[int, simaccel.CompileReport]:
    """Call the compiled ``_probs`` under three temperatures; (graphs compiled, last report)."""
    global TEMPERATURE
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(_probs, backend="simaccel", dynamic=False, options=options)
    x = torch.randn(4, 32)
    try:
        for t in (0.7, 0.8, 0.9):
            TEMPERATURE = t
            torch.testing.assert_close(step(x), torch.softmax(x / t, dim=-1))
    finally:
        TEMPERATURE = 0.7
    return counters["stats"]["unique_graphs"], simaccel.reports()[-1]


def test_single_lift_pattern_string_lifts_that_source() -> None:
    graphs, report = _run_temperatures({"lift": "G['TEMPERATURE']"})
    assert graphs == 1
    assert report.guards.lifted_sources == ("G['TEMPERATURE']",)


def test_single_keep_pattern_string_keeps_that_source() -> None:
    graphs, report = _run_temperatures({"keep": "G['TEMPERATURE']"})
    assert graphs == 3  # a new temperature recompiles, as with Dynamo's own handling
    assert "G['TEMPERATURE']" in report.guards.kept_sources

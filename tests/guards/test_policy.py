"""Lift policy: option parsing, pattern validation and matching (no Dynamo involved)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simaccel.errors import InvalidOptionError
from simaccel.guards import LiftPolicy, SourcePattern
from simaccel.guards.policy import parse_source_path


@pytest.mark.parametrize("text", [
    "L['alpha']", 'L["alpha"]', "G['GAIN']", "L['self'].scale", "L['cfg']['lr']",
    "L['xs'][1]", "L['self'].sub.k", "L['self'].*", "L['cfg'][*]", "  L['a']  ",
])
def test_valid_patterns(text: str) -> None:
    assert SourcePattern.parse(text, "lift").text == text.strip()


@pytest.mark.parametrize("text", [
    "alpha", "L[alpha]", "L['alpha'", "X['a']", "L['a'].", "L['a'].1x", "L['a'][b]",
    "L['a'] + 1", "", "   ", 3, None, "self.scale",
])
def test_malformed_patterns_raise(text: object) -> None:
    with pytest.raises(InvalidOptionError, match="lift"):
        SourcePattern.parse(text, "lift")


@pytest.mark.parametrize("pattern,source,expected", [
    ("L['alpha']", "L['alpha']", True),
    ('L["alpha"]', "L['alpha']", True),
    ("L['alpha']", "L['alphas']", False),
    ("L['alpha']", "G['alpha']", False),
    ("L['self'].scale", "L['self'].scale", True),
    ("L['self'].sub.k", "L['self']._modules['sub'].k", True),
    ("L['self']._modules['sub'].k", "L['self'].sub.k", True),
    ("L['self'].*", "L['self'].k", True),
    ("L['self'].*", "L['self'].sub.k", False),
    ("L['cfg'][*]", "L['cfg']['lr']", True),
    ("L['cfg'][*]", "L['cfg'][0]", True),
    ("L['xs'][1]", "L['xs']['1']", False),
    ("L['xs'][1]", "L['xs'][1]", True),
    ("L['x']", "___odict_getitem(L['x'], 'a')", False),
])
def test_pattern_matching(pattern: str, source: str, expected: bool) -> None:
    assert SourcePattern.parse(pattern, "lift").matches(source) is expected


def test_parse_source_path_folds_modules() -> None:
    assert parse_source_path("L['self']._modules['layers']._modules['0'].k") == (
        ("root", "L", "self"), ("attr", "layers"), ("attr", "0"), ("attr", "k"))


def test_policy_modes() -> None:
    assert LiftPolicy.parse().mode == "auto"
    assert LiftPolicy.parse("off").decide("L['a']") == "lift='off'"
    assert LiftPolicy.parse("auto").decide("L['a']") is None
    named = LiftPolicy.parse(["L['a']", "G['B']"])
    assert named.mode == "patterns"
    assert named.decide("L['a']") is None and named.decide("G['B']") is None
    assert named.decide("L['c']") == "not named by a lift pattern"


def test_keep_wins_over_lift() -> None:
    policy = LiftPolicy.parse(["L['a']"], keep=["L['a']"])
    assert policy.decide("L['a']") == "keep pattern L['a']"
    assert LiftPolicy.parse("auto", keep=("L['self'].*",)).decide("L['self'].k") is not None


_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
_ACCESSOR = st.one_of(
    _NAMES.map(lambda n: f".{n}"),
    _NAMES.map(lambda n: f"['{n}']"),
    st.integers(0, 99).map(lambda i: f"[{i}]"),
)


@settings(max_examples=200, deadline=None)
@given(root=st.sampled_from("LG"), name=_NAMES, accessors=st.lists(_ACCESSOR, max_size=4))
def test_every_source_path_is_a_pattern_matching_itself(root, name, accessors) -> None:
    text = f"{root}['{name}']" + "".join(accessors)
    pattern = SourcePattern.parse(text, "lift")
    assert pattern.matches(text)
    assert not pattern.matches(text + ".zz_extra")
    assert not SourcePattern.parse(text + ".zz_other", "lift").matches(text)

"""Source names as text (simaccel.guards.sources): what a Guard's source may be."""
from __future__ import annotations

import pytest

from simaccel.guards.sources import parse_source


@pytest.mark.parametrize("text,root,steps", [
    ("L['x']", ("L", "x"), []),
    ('L["x"]', ("L", "x"), []),
    ("G['CFG']['mode']", ("G", "CFG"), [("item", "mode")]),
    ("L['self'].scale", ("L", "self"), [("attr", "scale")]),
    ("L['self']._modules['lin']._parameters['weight']", ("L", "self"),
     [("attr", "_modules"), ("item", "lin"), ("attr", "_parameters"), ("item", "weight")]),
    ("L['xs'][0]", ("L", "xs"), [("item", 0)]),
])
def test_parse_source(text: str, root: tuple[str, str], steps: list) -> None:
    assert parse_source(text) == (root, steps)


@pytest.mark.parametrize("text,match", [
    ("x", "unsupported syntax"),
    ("L[0]", "takes a variable name"),
    ("L['x'][i]", "unsupported syntax"),
    ("L['x'].size()", "unsupported syntax"),
    ("L['x'", "not a source expression"),
])
def test_parse_source_rejects(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_source(text)

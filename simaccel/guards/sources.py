"""Source names as text: parsing ``L['x'].attr['k']`` and ``dynamic_sources`` entries.

Pure Python; :mod:`simaccel.guards.dynamo` turns the parsed steps into Dynamo sources.
"""
from __future__ import annotations

import ast
import re
from typing import Any


def exact_source_regex(name: str) -> str:
    """A ``dynamic_sources`` entry matching exactly ``name``.

    Entries are regexes split on ',' with spaces removed and an optional ':N' suffix, so
    those characters are written as escapes that survive that parsing.
    """
    escaped = re.escape(name)
    for char, code in ((" ", r"\x20"), (",", r"\x2c"), (":", r"\x3a")):
        escaped = escaped.replace("\\" + char, code).replace(char, code)
    return escaped + "$"


def parse_source(text: str) -> tuple[tuple[str, str], list[tuple[str, Any]]]:
    """Split a source name into its root and steps.

    ``"L['self'].cfg['mode']"`` -> ``(("L", "self"), [("attr", "cfg"), ("item", "mode")])``.
    The root is ``("L", local name)`` or ``("G", global name)``; steps are ``.attribute``
    and ``[constant]`` items. Raises ``ValueError`` for anything else.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as err:
        raise ValueError(f"not a source expression: {err.msg}") from None
    steps: list[tuple[str, Any]] = []
    while True:
        if isinstance(node, ast.Attribute):
            steps.append(("attr", node.attr))
            node = node.value
            continue
        if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)):
            raise ValueError(f"unsupported syntax {ast.unparse(node)!r}: use L['name'], "
                             f"G['name'], .attribute and [constant] items")
        key = node.slice.value
        if isinstance(node.value, ast.Name) and node.value.id in ("L", "G"):
            if not isinstance(key, str):
                raise ValueError(f"{node.value.id}[...] takes a variable name, got {key!r}")
            return (node.value.id, key), steps[::-1]
        steps.append(("item", key))
        node = node.value

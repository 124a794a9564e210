"""Lift policy: which baked-in Python scalars simaccel asks Dynamo to turn into graph inputs.

A policy comes from the backend options ``lift`` and ``keep``:

* ``lift="auto"`` (default): every float/int whose value Dynamo baked into the graph.
* ``lift="off"``: nothing; every value guard stays (Dynamo's own behaviour).
* ``lift=[patterns]``: only the sources matching one of the patterns.
* ``keep=[patterns]``: sources never lifted, whatever ``lift`` says.

(The options also take a single pattern string; :mod:`simaccel.options` validates their
form and hands this module tuples.)

A pattern is a Dynamo source name as printed by ``TORCH_LOGS=guards``: a root ``L['name']``
(frame local / argument / closure cell) or ``G['name']`` (module global) followed by any
number of ``.attr``, ``['key']`` or ``[index]`` accessors, e.g. ``L['alpha']``,
``G['GAIN']``, ``L['self'].scale``, ``L['cfg']['lr']``, ``L['xs'][1]``.  A segment written
``*`` (``L['self'].*``, ``L['cfg'][*]``) matches any one accessor.  Submodules may be
written either way: ``L['self'].sub.k`` matches Dynamo's ``L['self']._modules['sub'].k``.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from simaccel.errors import InvalidOptionError
from simaccel.guards.nn_constants import nn_constant_reason
from simaccel.guards.records import ScalarSite

# One token of a source path: ("root", "L", name) / ("attr", name) / ("item", key).
Token = tuple[str, ...]

WILDCARD = "*"

_ROOT_RE = re.compile(r"""([LG])\[\s*(?:'([^']*)'|"([^"]*)")\s*\]""")
_ATTR_RE = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*|\*)")
_ITEM_RE = re.compile(r"""\[\s*(?:'([^']*)'|"([^"]*)"|(-?\d+)|(\*))\s*\]""")

_EXAMPLES = "L['alpha'], G['GAIN'], L['self'].scale, L['cfg']['lr'], L['xs'][1]"


def parse_source_path(text: str) -> tuple[Token, ...] | None:
    """Tokenize a Dynamo source name (or a pattern); ``None`` if it is not a plain path.

    Dynamo's ``._modules['sub']`` accessor is folded into ``.sub`` so that user patterns
    can name submodule attributes the way they are written in Python.
    """
    m = _ROOT_RE.match(text)
    if m is None:
        return None
    tokens: list[Token] = [("root", m.group(1), m.group(2) if m.group(2) is not None
                            else m.group(3))]
    pos = m.end()
    while pos < len(text):
        attr = _ATTR_RE.match(text, pos)
        if attr is not None:
            tokens.append(("attr", attr.group(1)))
            pos = attr.end()
            continue
        item = _ITEM_RE.match(text, pos)
        if item is None:
            return None
        key = next(g for g in item.groups() if g is not None)
        # Quoted keys stay strings, bare digits are list indices: '1' and 1 differ.
        kind = "index" if item.group(3) is not None else "item"
        tokens.append((kind, key))
        pos = item.end()
    return tuple(_fold_modules(tokens))


def _fold_modules(tokens: list[Token]) -> list[Token]:
    """Rewrite ``._modules['sub']`` (Dynamo's spelling) into ``.sub`` (the user's)."""
    folded: list[Token] = []
    i = 0
    while i < len(tokens):
        if (tokens[i] == ("attr", "_modules") and i + 1 < len(tokens)
                and tokens[i + 1][0] == "item"):
            folded.append(("attr", tokens[i + 1][1]))
            i += 2
            continue
        folded.append(tokens[i])
        i += 1
    return folded


def _segment_matches(pattern: Token, token: Token) -> bool:
    if pattern[0] == "root":
        return pattern == token
    if pattern[-1] == WILDCARD:
        # "attr *" only matches attributes; "[*]" matches any item or index.
        return token[0] == pattern[0] or (pattern[0] != "attr" and token[0] != "attr")
    if {pattern[0], token[0]} <= {"item", "index"}:
        return pattern[1] == token[1] and pattern[0] == token[0]
    return pattern == token


@dataclass(frozen=True)
class SourcePattern:
    """A validated source pattern (see the module docstring for the syntax)."""

    text: str
    tokens: tuple[Token, ...]

    @classmethod
    def parse(cls, text: object, option: str) -> SourcePattern:
        """Validate ``text``; raises :class:`InvalidOptionError` naming ``option``."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidOptionError(
                f"{option}: pattern {text!r} is not a non-empty string; "
                f"write Dynamo source names such as {_EXAMPLES}")
        tokens = parse_source_path(text.strip())
        if tokens is None:
            raise InvalidOptionError(
                f"{option}: malformed source pattern {text!r}; expected L['name'] or "
                f"G['name'] followed by .attr, ['key'] or [index] accessors "
                f"(e.g. {_EXAMPLES}); '*' matches any one accessor")
        return cls(text.strip(), tokens)

    def matches(self, source_name: str) -> bool:
        """True if Dynamo source ``source_name`` is named by this pattern."""
        tokens = parse_source_path(source_name)
        if tokens is None or len(tokens) != len(self.tokens):
            return False
        return all(_segment_matches(p, t) for p, t in zip(self.tokens, tokens))


@dataclass(frozen=True)
class LiftPolicy:
    """What to lift: ``mode`` is ``"auto"``, ``"off"`` or ``"patterns"``."""

    mode: str = "auto"
    lift: tuple[SourcePattern, ...] = ()
    keep: tuple[SourcePattern, ...] = ()

    @classmethod
    def parse(cls, lift: str | Sequence[str] = "auto", keep: Sequence[str] = ()) -> LiftPolicy:
        """Build a policy from the ``lift`` and ``keep`` backend options as
        :func:`simaccel.options.parse_options` returns them: ``lift`` is "auto", "off" or
        a sequence of patterns, ``keep`` a sequence of patterns. Their form is validated
        there, once; a malformed pattern still raises :class:`InvalidOptionError` here.
        """
        keep_patterns = tuple(SourcePattern.parse(p, "keep") for p in keep)
        if lift in ("auto", "off"):
            return cls(str(lift), (), keep_patterns)
        patterns = tuple(SourcePattern.parse(p, "lift") for p in lift)
        return cls("patterns", patterns, keep_patterns)

    def decide(self, source_name: str) -> str | None:
        """``None`` if ``source_name`` may be lifted, else the reason it is kept."""
        if self.mode == "off":
            return "lift='off'"
        for pattern in self.keep:
            if pattern.matches(source_name):
                return f"keep pattern {pattern.text}"
        if self.mode == "patterns" and not any(p.matches(source_name) for p in self.lift):
            return "not named by a lift pattern"
        return None


def keep_reason(site: ScalarSite) -> str | None:
    """Why a value guard must stay whatever the policy says; ``None`` if it can be lifted."""
    if site.kind == "bool":
        return "bool: steers control flow"
    if site.kind in ("str", "None", "enum"):
        return f"{site.kind}: not a number, cannot be a graph input"
    if site.kind == "float" and not site.liftable:
        return "NaN/inf: Dynamo specializes non-finite floats"
    if site.kind not in ("float", "int"):
        return f"{site.kind} value: not a Python scalar"
    return nn_constant_reason(site.owner, site.attr)

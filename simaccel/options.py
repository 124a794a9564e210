"""Parsing of ``torch.compile(..., backend="simaccel", options={...})``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simaccel.errors import InvalidOptionError

VALID_OPTIONS = ("lift", "keep", "fallback", "guards")
FALLBACK_MODES = ("host", "error")


@dataclass(frozen=True)
class Options:
    """Backend options. ``lift``: "auto", "off" or a tuple of source patterns;
    ``keep``: patterns never lifted; ``fallback``: "host" or "error"; ``guards``:
    extra :class:`simaccel.Guard` objects."""

    lift: Any = "auto"
    keep: tuple[str, ...] = ()
    fallback: str = "host"
    guards: tuple[Any, ...] = field(default_factory=tuple)


def parse_options(options: dict[str, Any] | None) -> Options:
    """Validate ``options``; unknown names or bad values raise :class:`InvalidOptionError`."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(VALID_OPTIONS))
    if unknown:
        raise InvalidOptionError(
            f"unknown simaccel option(s) {unknown}; valid options are {list(VALID_OPTIONS)}")
    fallback = options.get("fallback", "host")
    if fallback not in FALLBACK_MODES:
        raise InvalidOptionError(
            f"option 'fallback' must be one of {list(FALLBACK_MODES)}, got {fallback!r}")
    lift = options.get("lift", "auto")
    if isinstance(lift, (list, tuple)):
        lift = tuple(lift)
    elif lift not in ("auto", "off"):
        raise InvalidOptionError(
            f"option 'lift' must be 'auto', 'off' or a list of source patterns such as "
            f"\"L['alpha']\", got {lift!r}")
    keep = options.get("keep", ())
    if isinstance(keep, str) or not isinstance(keep, (list, tuple)):
        raise InvalidOptionError(f"option 'keep' must be a list of source patterns, got {keep!r}")
    guards = options.get("guards", ())
    if not isinstance(guards, (list, tuple)):
        raise InvalidOptionError(f"option 'guards' must be a list of simaccel.Guard, got {guards!r}")
    return Options(lift=lift, keep=tuple(keep), fallback=fallback, guards=tuple(guards))

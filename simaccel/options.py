"""Parsing of ``torch.compile(..., backend="simaccel", options={...})``.

This is the one place where option values are validated: the layers below take the
:class:`Options` it returns as they are (:class:`~simaccel.guards.policy.LiftPolicy` builds
its patterns from ``lift``/``keep`` without checking their form again).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simaccel.errors import InvalidOptionError
from simaccel.guards.policy import SourcePattern

VALID_OPTIONS = ("lift", "keep", "fallback", "guards", "shape_buckets", "tier0")
FALLBACK_MODES = ("host", "error")
#: the special ``lift`` strings; any other string is one source pattern.
LIFT_MODES = ("auto", "off")


@dataclass(frozen=True)
class Options:
    """Backend options, validated. ``lift``: "auto", "off" or a tuple of source patterns;
    ``keep``: patterns never lifted; ``fallback``: "host" or "error"; ``guards``:
    extra :class:`simaccel.Guard` objects; ``shape_buckets``: None, "pow2" or a tuple of
    bucket upper bounds for dynamic sizes (:mod:`simaccel.guards.buckets`); ``tier0``:
    kernels missing from the cache run their numpy form until numba has compiled them
    in the background (:mod:`simaccel.codegen.tiered`); None (default): on unless
    ``SIMACCEL_TIER0=0``; False for measurements that want compiled kernels only;
    "only": the tier-0 forms and nothing compiled for them (a reference mode, as
    ``NUMBA_DISABLE_JIT``)."""

    lift: str | tuple[str, ...] = "auto"
    keep: tuple[str, ...] = ()
    fallback: str = "host"
    guards: tuple[Any, ...] = field(default_factory=tuple)
    shape_buckets: str | tuple[int, ...] | None = None
    tier0: bool | str | None = None


def parse_options(options: dict[str, Any] | None) -> Options:
    """Validate ``options``; unknown names or bad values raise :class:`InvalidOptionError`.

    ``lift`` and ``keep`` take one source pattern (``"G['TEMPERATURE']"``) or a list or
    tuple of them; every pattern is checked here, so a typo fails at the first compile
    whether or not the frame has anything to lift.
    """
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
    if not (isinstance(lift, str) and lift in LIFT_MODES):
        lift = _patterns(lift, "lift")
    guards = options.get("guards", ())
    if not isinstance(guards, (list, tuple)):
        raise InvalidOptionError(f"option 'guards' must be a list of simaccel.Guard, got {guards!r}")
    tier0 = options.get("tier0")
    if tier0 is not None and not isinstance(tier0, bool) and tier0 != "only":
        raise InvalidOptionError(
            f"option 'tier0' must be True, False or \"only\", got {tier0!r}")
    return Options(lift=lift, keep=_patterns(options.get("keep", ()), "keep"), tier0=tier0,
                   fallback=fallback, guards=tuple(guards),
                   shape_buckets=_buckets(options.get("shape_buckets")))


def _buckets(value: object) -> str | tuple[int, ...] | None:
    """``shape_buckets``: None, "pow2", or increasing positive bucket upper bounds."""
    if value is None or value == "pow2":
        return value
    if isinstance(value, (list, tuple)) and value and all(
            type(v) is int and v > 0 for v in value) and list(value) == sorted(set(value)):
        return tuple(value)
    raise InvalidOptionError(
        f"option 'shape_buckets' must be 'pow2' or a list of increasing positive ints (bucket "
        f"upper bounds, e.g. [16, 64, 256]), got {value!r}")


def _patterns(value: object, option: str) -> tuple[str, ...]:
    """One pattern string or a list/tuple of them -> the tuple of stripped patterns."""
    modes = "'auto', 'off', " if option == "lift" else ""
    if isinstance(value, str):
        value = (value,)
    elif not isinstance(value, (list, tuple)):
        raise InvalidOptionError(
            f"option {option!r} must be {modes}a source pattern such as \"G['GAIN']\" or a "
            f"list of them, got {value!r}")
    patterns = []
    for text in value:
        try:
            patterns.append(SourcePattern.parse(text, option).text)
        except InvalidOptionError as err:
            if option == "lift" and isinstance(text, str) and text.strip().lower() in LIFT_MODES:
                raise InvalidOptionError(
                    f"option 'lift': {text!r} is not a source pattern; the modes are written "
                    f"lift='auto' or lift='off' (one lower-case string, not in a list)") from err
            if option == "lift" and len(value) == 1:
                raise InvalidOptionError(f"{err}; option 'lift' also takes 'auto' or 'off'") from err
            raise
    return tuple(patterns)

"""The guard report of one compiled graph: what was lifted, which guards went, which stayed.

``str(report)`` is meant for people (the lines read like ``TORCH_LOGS=guards``); the fields
are meant for the codegen and for tests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# How a lifted scalar reaches the compiled graph (``LiftedScalar.arrives_as``).
ARRIVES_AS_TENSOR = "float64 0-d tensor"
ARRIVES_AS_SYMINT = "SymInt"
ARRIVES_AS_GUARD_ONLY = "not a graph input (only its predicate guard uses it)"


@dataclass(frozen=True)
class LiftedScalar:
    """A Python scalar that now reaches the graph as an input instead of a baked constant.

    ``placeholder``/``input_index`` locate it among the graph's placeholders (the same
    positions as ``example_inputs``); both are ``None`` when the graph does not use the value
    (it only steers a branch, so it is checked by a predicate guard in ``guards``).
    ``value`` is the plain Python number seen while tracing: use it as the example value.
    ``lifted_by`` is ``"simaccel"`` or ``"dynamo"`` (Dynamo made it an input on its own, e.g.
    under ``dynamic=True`` or after its automatic-dynamic recompile).
    """

    source: str
    kind: str
    where: str
    value: float | int
    arrives_as: str
    placeholder: str | None = None
    input_index: int | None = None
    guards: tuple[str, ...] = ()
    lifted_by: str = "simaccel"

    def __str__(self) -> str:
        loc = (f"placeholder {self.placeholder} (input {self.input_index})"
               if self.placeholder is not None else "no placeholder")
        text = (f"{self.source}: {self.kind} {self.where} = {self.value!r} -> "
                f"{self.arrives_as}, {loc}")
        if self.lifted_by != "simaccel":
            text += f" [lifted by {self.lifted_by}]"
        if self.guards:
            text += "; guarded by " + ", ".join(self.guards)
        return text


@dataclass(frozen=True)
class DroppedGuard:
    """A value guard that lifting replaced: ``before`` -> ``after`` (readable guard text)."""

    source: str
    before: str
    after: str

    def __str__(self) -> str:
        return f"{self.before}  ->  {self.after}"


@dataclass(frozen=True)
class KeptGuard:
    """A value guard that stays, and why (a change of that value recompiles the frame)."""

    source: str
    guard: str
    reason: str

    def __str__(self) -> str:
        return f"{self.guard}  ({self.reason})"


@dataclass(frozen=True)
class AddedGuard:
    """A guard the backend or a user added to the frame (see :mod:`simaccel.guards.added`).

    ``text`` is the guard as Dynamo's guard printout shows it (``name: expression``);
    ``compiled_result`` is the check's result recorded at compile time (the guard passes
    while the check keeps giving it); ``added_by`` is ``user``, ``simaccel`` (device
    guards) or ``backend`` (a backend pass).
    """

    name: str
    source: str
    text: str
    compiled_result: bool
    added_by: str

    def __str__(self) -> str:
        where = self.source or "the frame"
        return f"{self.text}  [on {where}, added by {self.added_by}]"


@dataclass(frozen=True)
class GuardReport:
    """What :func:`simaccel.guards.lift_scalars` did for one graph.

    ``retraced`` is True when Dynamo re-traced the frame so that the lifted scalars became
    graph inputs; ``warnings`` lists what could not be done (also logged on ``simaccel``).
    ``added`` lists the guards added to the frame: a live list, so guards that backend passes
    add later in the same frame compile appear too. ``device_plan`` holds the
    :class:`~simaccel.guards.device.DevicePlanFacts` the device guards pin (or ``None``).
    """

    policy: str
    lifted: tuple[LiftedScalar, ...] = ()
    dropped: tuple[DroppedGuard, ...] = ()
    kept: tuple[KeptGuard, ...] = ()
    retraced: bool = False
    warnings: tuple[str, ...] = field(default=())
    added: list[AddedGuard] = field(default_factory=list, compare=False)
    device_plan: Any = field(default=None, compare=False)

    @property
    def lifted_sources(self) -> tuple[str, ...]:
        """Source names of the lifted scalars, in report order."""
        return tuple(s.source for s in self.lifted)

    @property
    def kept_sources(self) -> tuple[str, ...]:
        """Source names whose value guards stayed."""
        return tuple(k.source for k in self.kept)

    def __str__(self) -> str:
        lines = [f"guard report (lift={self.policy}, "
                 f"{'re-traced' if self.retraced else 'no re-trace'})"]
        sections: list[tuple[str, tuple[object, ...]]] = [
            ("lifted scalars", self.lifted),
            ("guards dropped (before -> after)", self.dropped),
            ("value guards kept", self.kept),
            ("added guards", tuple(self.added)),
            ("warnings", self.warnings),
        ]
        for title, items in sections:
            lines.append(f"  {title}: {len(items) if items else 'none'}")
            lines.extend(f"    {item}" for item in items)
        if self.device_plan is not None:
            lines.append(f"  device plan: {self.device_plan}")
        return "\n".join(lines)

"""A host fallback op in a lowered graph: torch runs it on host copies of its operands.

Like a kernel it declares the device buffers it ``reads`` (copied device to host before
it runs) and ``writes`` (its results, copied back after); ``on_device`` is False.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from simaccel.codegen.values import Realized


@dataclass
class HostOp:
    """An op run by torch on the host, with operands copied off and results back."""

    name: str
    target: Any
    args: Any  # fx args with Realized values in place of nodes
    kwargs: Any
    outputs: list[Realized | None]  # where each tensor result goes on the device
    reason: str
    reads: frozenset[str] = field(init=False)
    writes: frozenset[str] = field(init=False)
    on_device: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self.reads = frozenset(_realized_buffers((self.args, self.kwargs)))
        self.writes = frozenset(o.layout.buffer for o in self.outputs if o is not None)


def _realized_buffers(obj: Any) -> set[str]:
    if isinstance(obj, Realized):
        return {obj.layout.buffer}
    if isinstance(obj, (list, tuple)):
        return set().union(*(_realized_buffers(o) for o in obj)) if obj else set()
    if isinstance(obj, dict):
        return _realized_buffers(list(obj.values()))
    return set()

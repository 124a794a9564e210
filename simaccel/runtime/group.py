"""Several kernels launched as one device command, and how any kernel is bound to its
arguments.

A torch.optim step lowers to a handful of small kernels per parameter; on the device
each launch costs more host time (the launch itself, the scheduling, the trace span)
than its loop. A :class:`LaunchGroup` is what a device's command list or CUDA graph is:
its kernels, each compiled (and cached) on its own, run in program order from one
launch, scheduled as one compute item. It takes the concatenation of its parts'
arguments (buffers, then launch parameters, then size-bank slots), as one kernel would.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class GroupPart:
    """One kernel of a group: ``fn`` and how many buffers, launch parameters and size
    slots of the group's arguments are its own."""

    fn: Callable[..., Any]
    buffers: int
    params: int
    slots: int


class LaunchGroup:
    """Kernels run in order by one launch: ``fn(*buffers, *params, *slots)`` where each
    list is the concatenation of the parts' own, in part order."""

    def __init__(self, parts: Sequence[GroupPart]):
        self.parts = tuple(parts)

    def __call__(self, *args: Any) -> None:
        for part, own, _ in self._slices(args, None):
            part.fn(*own)

    def bind(self, *args: Any, addresses: Sequence[int | None] | None = None
             ) -> Callable[[], None]:
        """A zero-argument launch of every part on ``args`` (``addresses``: the data
        address of each buffer argument, as for one kernel). Native parts convert their
        arguments once, for their own launches and the command list alike."""
        slices = self._slices(args, addresses)
        if all(hasattr(p.fn, "native_bind") for p in self.parts):
            bound = [part.fn.native_bind(*own, addresses=own_addresses)
                     for part, own, own_addresses in slices]
            return _RecordedLaunch(tuple(launch for launch, _ in bound),
                                   self.parts[0].fn.command_list,
                                   [entry for _, entry in bound])
        calls = tuple(bind_launch(part.fn, own, own_addresses)
                      for part, own, own_addresses in slices)

        def launch() -> None:
            for call in calls:
                call()
        return launch

    def _slices(self, args: Sequence[Any], addresses: Sequence[int | None] | None
                ) -> list[tuple[GroupPart, list[Any], list[int | None] | None]]:
        """(part, its arguments, their addresses) for each part."""
        n_buffers = sum(p.buffers for p in self.parts)
        n_params = sum(p.params for p in self.parts)
        buffers, params, slots = (args[:n_buffers], args[n_buffers:n_buffers + n_params],
                                  args[n_buffers + n_params:])
        slices = []
        b = q = s = 0
        for part in self.parts:
            own = [*buffers[b:b + part.buffers], *params[q:q + part.params],
                   *slots[s:s + part.slots]]
            own_addresses = None if addresses is None else list(addresses[b:b + part.buffers])
            slices.append((part, own, own_addresses))
            b, q, s = b + part.buffers, q + part.params, s + part.slots
        return slices


class _RecordedLaunch:
    """A group's launch that becomes one native command list once it has run
    :data:`RECORD_AFTER` times on the same arguments (building one costs a few ms, so a
    launch bound for one call, such as a new size tuple's, never pays it). ``calls``: the
    parts' own launches until then; ``build`` and ``entries``: the command list's."""

    __slots__ = ("calls", "build", "entries", "runs", "recorded")

    def __init__(self, calls: tuple[Callable[[], Any], ...], build: Callable[..., Any],
                 entries: list):
        self.calls, self.build, self.entries = calls, build, entries
        self.runs = 0
        self.recorded: Callable[[], None] | None = None

    def __call__(self) -> None:
        recorded = self.recorded
        if recorded is not None:
            recorded()
            return
        for call in self.calls:
            call()
        self.runs += 1
        if self.runs >= RECORD_AFTER:
            self.recorded = self.build(self.entries)


#: launches of a bound group before it is recorded as a native command list
RECORD_AFTER = 3


def bind_launch(fn: Callable[..., Any], args: list[Any],
                addresses: list[int | None] | None = None,
                operands: list[Any] | None = None) -> Callable[[], Any]:
    """``fn`` launched on ``args`` as a zero-argument call, made once per workspace and
    size tuple (the views never change while it is cached); a kernel that can pre-convert
    its arguments (a native object: C pointers; a group: its parts) does so in its
    ``bind``, given the data ``addresses`` (bytes) of the array arguments the caller
    knows. ``operands``: per array argument, its
    :class:`~simaccel.runtime.resident.ResidentOperand` or None, for a kernel that keeps
    derived forms of resident inputs (``fn.keeps_derived``)."""
    bind = getattr(fn, "bind", None)
    if bind is None:
        return functools.partial(fn, *args)
    if operands is not None:
        return bind(*args, addresses=addresses, operands=operands)
    return bind(*args, addresses=addresses) if addresses is not None else bind(*args)

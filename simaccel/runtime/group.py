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
                                   [entry for _, entry in bound], self._buffer_slots(bound))
        return _PartLaunches(slices)

    def _buffer_slots(self, bound: list[tuple[Any, tuple[int, tuple]]]) -> list[Any]:
        """Per buffer argument of the group (in argument order), its C pointer in its
        part's bound arguments (a native part's C arguments: its kernel's
        ``array_slots``), which the command list reads at every launch."""
        slots = []
        for part, (_, entry) in zip(self.parts, bound):
            c_args = entry[1]  # (address, C arguments[, convention])
            slots += [c_args[j] for j in part.fn.array_slots(part.buffers)]
        return slots

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
    parts' own launches until then; ``build`` and ``commands``: the command list's
    builder and entries (a replay may join them with its other launches':
    :mod:`simaccel.runtime.sequence`); ``pointers``: per buffer argument, its C pointer
    (:meth:`patch`)."""

    __slots__ = ("calls", "build_commands", "commands", "runs", "recorded", "pointers",
                 "kept")

    #: :meth:`patch` stores the address alone (the array is only kept alive), so an
    #: :class:`~simaccel.runtime.address.AddressReplay` may pass what holds the memory
    patched_by_address = True

    def __init__(self, calls: tuple[Callable[[], Any], ...], build: Callable[..., Any],
                 commands: list, pointers: list[Any]):
        self.calls, self.build_commands, self.commands = calls, build, tuple(commands)
        self.pointers = pointers
        self.runs = 0
        self.recorded: Callable[[], None] | None = None
        #: buffer position -> the array a patch pointed it at (kept alive)
        self.kept: dict[int, Any] = {}

    def patch(self, position: int, array: Any, address: int) -> None:
        """Point buffer argument ``position`` at ``array``, whose data address (bytes) is
        ``address``, of the dtype and size the launch was bound with (a host-mapped
        input or output at a new address: checked by the caller). The parts' launches
        and the recorded command list read it from then on, as a CUDA graph's updated
        kernel parameters: no part is bound again (a 12-kernel optimizer step took
        ~120 us to bind anew every step, its gradients being new tensors)."""
        self.pointers[position].value = address
        self.kept[position] = array

    def __call__(self) -> None:
        recorded = self.recorded
        if recorded is not None:
            recorded()
            return
        for call in self.calls:
            call()
        self.runs += 1
        if self.runs >= RECORD_AFTER:
            self.recorded = self.build_commands(self.commands)


class _PartLaunches:
    """A group's launch where some part is no native object (a prange kernel runs in
    numba's dispatcher), so no command list: each part launches on its own. ``slices``:
    (part, its arguments, their addresses) per part. :meth:`patch` as for
    :class:`_RecordedLaunch`."""

    __slots__ = ("calls", "where", "own", "kept", "at")

    def __init__(self, slices: list[tuple[GroupPart, list[Any], list[int | None] | None]]):
        self.calls: list[Callable[[], Any]] = []
        #: per buffer argument of the group: (its part, its position there, its C pointer
        #: where the part is native)
        self.where: list[tuple[int, int, Any]] = []
        self.own = [(part.fn, own) for part, own, _ in slices]
        self.kept: dict[int, Any] = {}
        #: buffer position -> the data address (bytes) a patch pointed it at
        self.at: dict[int, int] = {}
        for k, (part, own, addresses) in enumerate(slices):
            if hasattr(part.fn, "native_bind"):
                launch, entry = part.fn.native_bind(*own, addresses=addresses)
                c_args = entry[1]
                self.where += [(k, j, c_args[slot])
                               for j, slot in enumerate(part.fn.array_slots(part.buffers))]
            else:
                launch = bind_launch(part.fn, own, addresses)
                self.where += [(k, j, None) for j in range(part.buffers)]
            self.calls.append(launch)

    def __call__(self) -> None:
        for call in self.calls:
            call()

    def patch(self, position: int, array: Any, address: int) -> None:
        """Point buffer argument ``position`` at ``array`` (data address ``address``): a
        native part's C pointer changes in place; another part launches on its new
        arguments (a partial of the dispatcher: nothing to convert)."""
        if self.at.get(position) == address:
            return
        self.at[position] = address
        k, j, pointer = self.where[position]
        self.kept[position] = array
        if pointer is not None:
            pointer.value = address
            return
        fn, own = self.own[k]
        own[j] = array
        self.calls[k] = bind_launch(fn, own)


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

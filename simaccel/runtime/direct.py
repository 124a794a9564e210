"""Direct replays: a program's steady call entered straight from its caller.

:meth:`Program.run <simaccel.runtime.program.Program.run>` works out per call what a
steady call never changes: its workspace binding, whether the device was reconfigured or
a kernel's compiled form arrived since, host output arrays to download into. A
:class:`DirectReplay` is made once a binding has recorded its
:class:`~simaccel.runtime.replay.Replay`; each call checks by identity that the state it
was made in still holds (the program's workspace, the binding of the call's layout, its
record, the device generation and the kernel tier epoch: ~0.2 us) and replays the record,
the caller's ``download`` making the outputs from the device views under the program's
lock (a compiled graph clones them into new tensors: one allocation and copy per output
where it made an empty tensor, took its numpy view and copied into that). Anything else
(another state, an input the record does not fit) returns None before anything moves,
and the caller goes the general way.

The call moves the same bytes, runs the same kernels and lands on the timeline, trace and
counters exactly as the general replay (``tests/runtime/test_direct.py``).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from simaccel.runtime import tiers

#: ``download(outputs)``: appends each output, made from :meth:`DirectReplay.sources`
Download = Callable[[list[Any]], None]


class SteadyEntry:
    """A binding's replay entered by its caller instead of through :meth:`Program.run
    <simaccel.runtime.program.Program.run>`: what every such entry checks before it
    replays (:meth:`holds`) and counts after (:meth:`count`)."""

    __slots__ = ("program", "device", "bound", "replay", "block", "launches")

    def __init__(self, program: Any, bound: Any):
        self.program = program
        self.device = program.device
        self.bound = bound
        self.replay = bound.replay
        #: the workspace the binding's views lie in: the call goes the general way once
        #: the program holds another (the general call re-binds, the caller makes a new
        #: entry), as it does once the device or a kernel's tier moved on
        self.block = program._state.workspace
        self.launches = program._launches_per_call

    def holds(self, key: Any) -> bool:
        """Whether the state this entry was made in still holds for a call whose sizes'
        layout is ``key`` (under the program's lock): the device, the kernels' tier,
        the workspace, the binding of those sizes and its record (~0.2 us)."""
        program = self.program
        return program._generation == self.device.generation \
            and program._tier_epoch == tiers.current() \
            and program._state.workspace is self.block \
            and program._bound.get(key) is self.bound and self.bound.replay is self.replay

    def count(self, wall: int) -> None:
        """Count a replayed call whose kernels took ``wall`` ns (under the program's
        lock), as :meth:`Program.run` counts one."""
        program = self.program
        program._kernel_wall_ns = wall
        counts = program._counts
        counts.calls += 1
        counts.replayed_calls += 1
        counts.kernel_launches += self.launches
        counts.kernel_wall_ns += wall


class DirectReplay(SteadyEntry):
    """One binding's replay for a caller that makes its own outputs (see the module
    doc); made by :func:`direct_replay`."""

    __slots__ = ()

    def sources(self) -> list[np.ndarray]:
        """The device view of every output, by output position (writable views of the
        program's output buffers: read under the program's lock, by ``download`` only)."""
        views = []
        for _, src, _, _, _ in self.replay.outputs:
            view = src.view()
            view.flags.writeable = True  # its base is the device arena, writable
            views.append(view)
        return views

    def __call__(self, args: list[Any], data_ptrs: list[int] | None, layout: Any,
                 download: Download) -> list[Any] | None:
        """Replay the call on ``args`` (host arrays, Python numbers; ``data_ptrs`` and
        ``layout``, the :meth:`Program.layout_for` of ``args``, as :meth:`Program.run`
        takes them); returns what ``download`` appended, or None (nothing moved) when
        the state changed, the call's sizes have another binding or the record does not
        fit ``args``."""
        replay = self.replay
        with self.program._lock:
            if not self.holds(layout.key) or not replay.accepts_inputs(args, data_ptrs):
                return None
            outputs: list[Any] = []
            self.count(replay.run(args, outputs, data_ptrs, layout.sizes, 0.0, download))
        return outputs


def direct_possible(program: Any) -> bool:
    """Whether ``program``'s calls can ever replay directly: not with resident inputs,
    input write-backs, host-mapped inputs or outputs or host steps (their calls need
    :meth:`Program.run`'s per-call work)."""
    return not (program._resident_inputs or program._host_steps
                or not program._plain_download or program._mapped_indices)


def direct_replay(program: Any, layout: Any) -> DirectReplay | None:
    """The :class:`DirectReplay` of ``program``'s binding at ``layout`` (the last call's;
    :func:`direct_possible` said yes), or None while that binding has no record."""
    bound = program._bound.get(layout.key)
    workspace = program._state.workspace
    if bound is None or not bound.replay or bound.replay.bind_mapped is not None \
            or workspace is None or bound.offset != workspace.offset:
        return None
    positions = [position for position, *_ in bound.replay.outputs]
    if positions != list(range(len(program.spec.outputs))):
        return None  # an output the program does not copy back
    return DirectReplay(program, bound)

"""A replayed call's launches joined into native command lists.

A replay (:mod:`simaccel.runtime.replay`) runs the same launches on the same binding call
after call. Each launch is a foreign call from Python (~1-3 us, more right after a GEMM
left the caches cold; a GPT-2 forward makes 56). Once a binding's launches have run
:data:`~simaccel.runtime.group.RECORD_AFTER` times, every run of consecutive launches
that can be called from machine code (native and numba-entry kernels, launch groups, BLAS
GEMMs: each offers its ``commands``) becomes one command list
(:mod:`simaccel.codegen.commands`), as a CUDA graph records a stream's kernels once and
launches them as one. Launches patched to new arrays (host-mapped gradients, new every
step) are seen by the list, which reads their pointers at every launch; a launch bound
anew (:meth:`~simaccel.runtime.program.Program._bind_mapped`) drops the binding's
sequence, and the next call records again.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from simaccel.runtime.group import RECORD_AFTER


class LaunchSequence:
    """``launches`` run in order: one by one until they have run :data:`RECORD_AFTER`
    times, then as command lists and the launches no list can take. After a launch
    raised, :attr:`launched` is how many launches returned before it."""

    __slots__ = ("launches", "runs", "steps", "launched")

    def __init__(self, launches: Sequence[Callable[[], Any]]):
        self.launches = list(launches)
        self.runs = 0
        #: (callable, launches it covers, per command-list entry the launch it belongs
        #: to or None for a single launch), once recorded
        self.steps: list[tuple[Callable[[], Any], int, list[int] | None]] | None = None
        self.launched = 0

    def __call__(self) -> None:
        steps = self.steps
        if steps is None:
            self._one_by_one()
            return
        first = 0
        for call, count, owners in steps:
            try:
                call()
            except BaseException:
                self.launched = first if owners is None else \
                    first + owners[call.failed_entry()]  # type: ignore[attr-defined]
                raise
            first += count

    def _one_by_one(self) -> None:
        launched = 0
        try:
            for launch in self.launches:
                launch()
                launched += 1
        finally:
            self.launched = launched
        self.runs += 1
        if self.runs >= RECORD_AFTER:
            self.steps = record(self.launches)


def record(launches: Sequence[Callable[[], Any]]
           ) -> list[tuple[Callable[[], Any], int, list[int] | None]]:
    """The steps of :class:`LaunchSequence`: each run of two or more consecutive
    launches offering ``commands`` as one command list, every other launch on its own."""
    steps: list[tuple[Callable[[], Any], int, list[int] | None]] = []
    run: list[Callable[[], Any]] = []
    for launch in [*launches, None]:
        if launch is not None and getattr(launch, "commands", None):
            run.append(launch)
            continue
        if len(run) > 1:
            steps.append(_command_list(run))
        elif run:
            steps.append((run[0], 1, None))
        run = []
        if launch is not None:
            steps.append((launch, 1, None))
    return steps


def _command_list(run: list[Any]) -> tuple[Callable[[], Any], int, list[int]]:
    """One command list of ``run``'s entries, and per entry its launch's offset in
    ``run``."""
    entries: list[tuple] = []
    owners: list[int] = []
    for offset, launch in enumerate(run):
        entries += launch.commands
        owners += [offset] * len(launch.commands)
    return run[0].build_commands(entries), len(run), owners

"""The tier epoch: bumped whenever a kernel switches from its tier-0 form to its compiled
one (:mod:`simaccel.codegen.tiered`), so programs bind their launches again (the compiled
kernel's own binding: C pointers, command lists) at their next call."""
from __future__ import annotations

_EPOCH = [0]


def current() -> int:
    """The number of tier switches in this process so far."""
    return _EPOCH[0]


def bump() -> None:
    _EPOCH[0] += 1

"""A program's resident-input bookkeeping (simaccel.runtime.resident.ResidentState): which
resident inputs a call must upload, decided per buffer from content keys, and for a call
whose keys all equal the last call's by one comparison."""
from __future__ import annotations

from simaccel.runtime.resident import ResidentState
from simaccel.runtime.spec import InputPlan, Placement

PLANS = [InputPlan(0, "w", Placement.RESIDENT, "float32"),
         InputPlan(2, "b", Placement.RESIDENT, "float32")]


def _buffers(plans) -> list[str]:
    return [p.buffer for p in plans]


def test_a_call_uploads_only_what_changed_and_an_equal_call_nothing() -> None:
    state = ResidentState()
    assert _buffers(state.changed(PLANS, {0: ("t0", 0), 2: ("t2", 0)})) == ["w", "b"]
    assert state.changed(PLANS, {0: ("t0", 0), 2: ("t2", 0)}) == []  # a new, equal dict
    assert _buffers(state.changed(PLANS, {0: ("t0", 1), 2: ("t2", 0)})) == ["w"]
    assert state.keys == {"w": ("t0", 1), "b": ("t2", 0)}


def test_a_missing_key_always_uploads_and_is_never_the_equal_call() -> None:
    state = ResidentState()
    keys = {0: ("t0", 0)}
    assert _buffers(state.changed(PLANS, keys)) == ["w", "b"]
    assert state.held is None
    assert _buffers(state.changed(PLANS, keys)) == ["b"]


def test_a_key_set_or_forgotten_outside_a_call_ends_the_shortcut() -> None:
    """An in-place write (the next version) or a failed call (None) changes what the
    device holds: the next call compares buffer by buffer again."""
    state = ResidentState()
    keys = {0: ("t0", 0), 2: ("t2", 0)}
    state.changed(PLANS, keys)
    state.set_key("w", None)  # a failed call: the device copy is unknown
    assert _buffers(state.changed(PLANS, dict(keys))) == ["w"]
    state.set_key("b", ("t2", 1))  # written in place by the call: one version on
    assert _buffers(state.changed(PLANS, {0: ("t0", 0), 2: ("t2", 1)})) == []
    state.free()
    assert _buffers(state.changed(PLANS, {0: ("t0", 0), 2: ("t2", 1)})) == ["w", "b"]

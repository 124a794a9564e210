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


def test_the_views_outside_the_workspace_are_made_once_until_one_is_new() -> None:
    """Every binding (a decode step with a growing cache binds every call) reads the
    views of constants, resident inputs and the constant bank with their addresses: they
    are made again only when one of those views is new, or after ``free()``."""
    import numpy as np

    from simaccel.runtime.constbank import ConstantBank
    from simaccel.runtime.spec import SIZE_BANK

    arena = np.zeros(256, np.uint8)
    bank = ConstantBank([(1, "s", np.dtype(np.float32))], sizes=1)
    state = ResidentState()
    state.views["w"] = arena[:64].view(np.float32)
    state.bank = arena[128:128 + bank.nbytes]
    state.size_bank = bank.size_view(state.bank)
    views, addresses = state.fixed_views(bank)
    base = arena.ctypes.data
    assert addresses == {"w": base, "s": base + 128, SIZE_BANK: base + 128 + bank.sizes_offset}
    assert set(views) == {"w", "s", SIZE_BANK}
    assert state.fixed_views(bank)[0] is views  # nothing new: the same views
    state.views["w"] = arena[64:128].view(np.float32)  # a resident input's new block
    views, addresses = state.fixed_views(bank)
    assert addresses["w"] == base + 64 and views["w"] is state.views["w"]
    state.free()
    assert state._fixed is None


def test_a_resident_operand_follows_the_key_and_keeps_one_form_in_device_memory() -> None:
    """A library kernel's view of a resident input (ResidentOperand): its content key is
    the one uploaded now; a form kept for one key is found under that key only (another
    key drops it and gives its memory back), one per step, shared by whoever asks for the
    step; a device without room refuses; release_derived() (a released workspace) and
    free() give the memory back."""
    from collections import Counter

    from simaccel.runtime.memory import CachingAllocator
    counts: Counter = Counter()
    allocator = CachingAllocator(1 << 16, 64)
    state = ResidentState(allocator=allocator)
    operand = state.operand("w", "gemm_1", lambda key, n: counts.update({key: n}))
    in_use = lambda: allocator.memory_stats()["allocated_bytes.all.current"]  # noqa: E731
    assert operand.content() is None
    state.changed(PLANS, {0: ("t0", 0), 2: ("t2", 0)})
    key = operand.content()
    assert key == ("t0", 0) and operand.form(key) is None
    assert operand.keep(key, "reordered", 4096) and in_use() == 4096
    again = state.operand("w", "gemm_1", lambda key, n: None)  # the step at another size
    assert operand.form(key) == again.form(key) == "reordered"
    assert counts == {"derived_operands": 1, "derived_operand_bytes": 4096}
    state.changed(PLANS, {0: ("t0", 1), 2: ("t2", 0)})  # an in-place update uploaded
    assert operand.content() == ("t0", 1)
    assert operand.form(("t0", 1)) is None and in_use() == 0  # stale: dropped
    assert not operand.keep(("t0", 1), "too big", 1 << 20) and in_use() == 0
    other = state.operand("b", "gemm_2", lambda key, n: None)
    assert operand.keep(("t0", 1), "a", 4096) and other.keep(("t2", 0), "b", 4096)
    assert state.release_derived() == 8192 and in_use() == 0
    assert operand.form(("t0", 1)) is None
    assert operand.keep(("t0", 1), "a", 4096) and state.free() >= 4096 and in_use() == 0

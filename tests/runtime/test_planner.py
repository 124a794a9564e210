"""Static memory planner: live buffers never overlap; lower bound <= total <= naive."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simaccel.errors import SimAccelError
from simaccel.runtime.planner import PlanBuffer, plan_memory


@st.composite
def buffer_lists(draw) -> list[PlanBuffer]:
    n = draw(st.integers(0, 25))
    out = []
    for i in range(n):
        first = draw(st.integers(0, 20))
        last = first + draw(st.integers(0, 8))
        out.append(PlanBuffer(f"b{i}", draw(st.integers(0, 5000)), first, last))
    return out


@settings(max_examples=300, deadline=None)
@given(buffers=buffer_lists(), alignment=st.sampled_from([1, 64, 256, 4096]))
def test_plan_properties(buffers, alignment):
    plan = plan_memory(buffers, alignment)
    plan.check()
    assert set(plan.offsets) == {b.name for b in buffers}
    for a in buffers:
        off_a, size_a = plan.offsets[a.name], plan.sizes[a.name]
        assert off_a % alignment == 0 and size_a >= a.nbytes
        assert off_a + size_a <= plan.total_bytes
        for b in buffers:
            if a is not b and a.lives_with(b) and size_a and plan.sizes[b.name]:
                off_b = plan.offsets[b.name]
                assert off_a + size_a <= off_b or off_b + plan.sizes[b.name] <= off_a
    assert plan.lower_bound_bytes <= plan.total_bytes <= plan.naive_bytes
    assert plan.naive_bytes == sum(-(-b.nbytes // alignment) * alignment for b in buffers)


def test_chain_reuses_memory_and_hits_lower_bound():
    # a -> b -> c -> d: each buffer only lives with its neighbours (ping-pong)
    bufs = [PlanBuffer(n, 1000, i, i + 1) for i, n in enumerate("abcd")]
    plan = plan_memory(bufs, 256)
    assert plan.sizes["a"] == 1024
    assert plan.naive_bytes == 4096 and plan.lower_bound_bytes == 2048
    assert plan.total_bytes == 2048
    assert plan.offsets["a"] == plan.offsets["c"] and plan.offsets["b"] == plan.offsets["d"]
    assert "2048 bytes" in plan.summary()


def test_zero_sized_and_empty():
    plan = plan_memory([PlanBuffer("z", 0, 0, 5), PlanBuffer("x", 10, 0, 5)], 64)
    assert plan.offsets["z"] == 0 and plan.sizes["z"] == 0 and plan.total_bytes == 64
    empty = plan_memory([], 64)
    assert (empty.total_bytes, empty.lower_bound_bytes, empty.naive_bytes) == (0, 0, 0)


@pytest.mark.parametrize("make", [
    lambda: PlanBuffer("a", -1, 0, 0),
    lambda: PlanBuffer("a", 1, 3, 2),
    lambda: plan_memory([PlanBuffer("a", 1, 0, 0)] * 2, 64),
    lambda: plan_memory([], 48),
])
def test_invalid_inputs(make):
    with pytest.raises(SimAccelError):
        make()

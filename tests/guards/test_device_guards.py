"""simaccel's own device guards and the DevicePlanFacts they pin (issue 4, part 3).

End to end with backend="simaccel": an int crossing 2**31 moves to a 64-bit constant-bank
slot (one recompile), a misaligned view is detected as such, and a change of the device
config recompiles once. Facts are keyed by the position in ``example_inputs``.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

import simaccel
from conftest import unique_graphs
from simaccel.guards import DevicePlanFacts
from simaccel.guards.device import ALIGNED, DEVICE_CONFIG, INT_SLOT, fits_int32

TOL = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(autouse=True)
def fresh_reports() -> None:
    simaccel.clear_reports()


def last_plan() -> DevicePlanFacts:
    plan = simaccel.reports()[-1].guards.device_plan
    assert isinstance(plan, DevicePlanFacts)
    return plan


def added(name: str) -> list[Any]:
    return [g for g in simaccel.reports()[-1].guards.added if g.name == name]


def scale_by(x: torch.Tensor, n: int) -> torch.Tensor:
    return x * n + 1


def shifted(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0 - 1.0


def aligned_tensor(n: int, alignment: int) -> torch.Tensor:
    """A float32 tensor of ``n`` elements whose data pointer is a multiple of alignment."""
    base = torch.randn(n + alignment // 4)
    skip = (-base.data_ptr() % alignment) // 4
    out = base[skip:skip + n]
    assert out.data_ptr() % alignment == 0
    return out


def test_fits_int32_bounds() -> None:
    assert fits_int32(-2 ** 31) and fits_int32(2 ** 31 - 1)
    assert not fits_int32(2 ** 31) and not fits_int32(-2 ** 31 - 1)


def test_int_crossing_2_31_recompiles_once_and_stays_correct() -> None:
    compiled = torch.compile(scale_by, backend="simaccel")
    x = torch.randn(16, dtype=torch.float64)
    bits = []
    for n in (3, 4, 5):
        torch.testing.assert_close(compiled(x, n), scale_by(x, n))
    assert unique_graphs() == 1
    plan = last_plan()
    bits.append(plan.int_bits(1))
    assert plan[1] == {"int_bits": 32} and plan[0] == {"aligned": plan.aligned(0)}
    assert [g.source for g in added(INT_SLOT)] == ["L['n']"]
    for n in (2 ** 31 + 5, 2 ** 31 + 7, -2 ** 31 - 1, 2 ** 40):
        torch.testing.assert_close(compiled(x, n), scale_by(x, n))
    assert unique_graphs() == 2
    bits.append(last_plan().int_bits(1))
    assert bits == [32, 64]
    assert added(INT_SLOT)[0].compiled_result is False
    for n in (9, -7):  # back in 32-bit range: the first compile's entry serves them
        torch.testing.assert_close(compiled(x, n), scale_by(x, n))
    assert unique_graphs() == 2


def test_misaligned_view_is_detected() -> None:
    alignment = simaccel.get_device().config.alignment
    compiled = torch.compile(shifted, backend="simaccel")
    good = aligned_tensor(1024, alignment)
    torch.testing.assert_close(compiled(good), shifted(good), **TOL)
    assert last_plan().inputs == {0: {"aligned": True}}
    assert [g.compiled_result for g in added(ALIGNED)] == [True]

    bad = torch.randn(1025)[1:]  # 4 bytes past an aligned allocation
    assert bad.data_ptr() % alignment != 0
    torch.testing.assert_close(compiled(bad), shifted(bad), **TOL)
    assert unique_graphs() == 2
    assert last_plan().inputs == {0: {"aligned": False}}
    assert [g.compiled_result for g in added(ALIGNED)] == [False]

    for _ in range(3):  # each kind goes to its own entry, no more recompiles
        other = aligned_tensor(1024, alignment)
        torch.testing.assert_close(compiled(other), shifted(other), **TOL)
        odd = torch.randn(1025)[1:]
        torch.testing.assert_close(compiled(odd), shifted(odd), **TOL)
    assert unique_graphs() == 2


def test_device_config_change_recompiles_once() -> None:
    compiled = torch.compile(shifted, backend="simaccel")
    x = torch.randn(256)
    torch.testing.assert_close(compiled(x), shifted(x), **TOL)
    key = last_plan().config_key
    with simaccel.configure(dma_channels=2):
        for _ in range(3):
            torch.testing.assert_close(compiled(x), shifted(x), **TOL)
        assert unique_graphs() == 2
        assert last_plan().config_key != key
        assert last_plan().config_key == simaccel.get_device().config.key()
    torch.testing.assert_close(compiled(x), shifted(x), **TOL)  # old config, old entry
    assert unique_graphs() == 2
    assert [g.source for g in added(DEVICE_CONFIG)] == [""]


def test_facts_are_keyed_by_example_inputs_index() -> None:
    """A module: parameters and user inputs are graph inputs; a lifted float arrives as a
    0-d tensor Dynamo makes per call (no pointer to guard: the safe fact, not aligned);
    parameters are resident (no per-call guard)."""
    seen: list[tuple[list[Any], DevicePlanFacts]] = []

    from simaccel.guards import device_guards, lift_scalars

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]):
        lift_scalars(gm, example_inputs)
        seen.append((list(example_inputs), device_guards(gm, example_inputs,
                                                         simaccel.get_device())))
        return gm.forward

    linear = torch.nn.Linear(8, 8)

    def fn(x: torch.Tensor, alpha: float, n: int) -> torch.Tensor:
        return linear(x) * alpha + n

    compiled = torch.compile(fn, backend=backend)
    x = torch.randn(2, 8)
    compiled(x, 0.5, 2 ** 33)
    examples, facts = seen[-1]
    alignment = simaccel.get_device().config.alignment
    for index, example in enumerate(examples):
        if isinstance(example, torch.SymInt):
            assert facts[index] == {"int_bits": 64}
        elif isinstance(example, torch.Tensor) and example.dim() == 0:
            assert facts[index] == {"aligned": None}  # the lifted float: checked per call
        elif isinstance(example, torch.nn.Parameter):
            # checked at upload, not per call; requires_grad as Dynamo's guard pins it
            assert facts[index] == {"resident": True, "requires_grad": True}
        else:
            assert facts[index] == {"aligned": example.data_ptr() % alignment == 0}
    assert len(facts.inputs) == len(examples)
    assert sum(1 for f in facts.inputs.values() if "int_bits" in f) == 1


def test_dynamic_sizes_get_int_slot_guards_on_the_tensor() -> None:
    """Under dynamic=True a size symbol is an int input: its slot guard sits on the tensor.
    (A plain backend: the simaccel backend itself may specialize sizes while lowering.)"""
    from simaccel.guards import device_guards

    plans: list[DevicePlanFacts] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]):
        plans.append(device_guards(gm, example_inputs, simaccel.get_device()))
        return gm.forward

    compiled = torch.compile(shifted, backend=backend, dynamic=True)
    for n in (37, 41, 1000):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), shifted(x), **TOL)
    assert unique_graphs() == 1
    assert {"int_bits": 32} in plans[0].inputs.values()
    slot = [g for g in plans[0].guards if g.name == INT_SLOT]
    assert slot and slot[0].source == "L['x']" and "L['x'].size()[0]" in slot[0].text

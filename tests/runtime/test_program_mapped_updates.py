"""Mapped updates at the runtime level: a resident input its one kernel updates in place
is read and written in the caller's memory (:func:`place_mapped_updates`), never copied
back; its accesses are timed and counted as an h2d read and a d2h write. Programs are
built by hand from numpy kernels; results are compared with numpy."""
from __future__ import annotations

import numpy as np
import pytest

import simaccel.runtime.hostmap as hostmap
import simaccel.runtime.program as program_module
from simaccel.errors import SimAccelError
from simaccel.runtime.config import DeviceConfig
from simaccel.runtime.device import Device
from simaccel.runtime.hostmap import place_mapped_inputs, place_mapped_updates
from simaccel.runtime.program import Program
from simaccel.runtime.spec import (BufferDecl, HostStep, InputPlan, LaunchStep, OutputDecl,
                                   Placement, ProgramSpec)
from tests.runtime.test_program_host_mapped import aligned_array

N = 256  # float32 elements: 1024 bytes


def double_in_place(x: np.ndarray, g: np.ndarray) -> None:
    x[:] = x * 2.0 + g


def updating_x() -> LaunchStep:
    return LaunchStep("update", double_in_place, ("x", "g"), (), N, 12 * N,
                      frozenset({"x", "g"}), frozenset({"x"}))


def make_spec(steps: list, outputs: tuple[str, ...] = (), in_place: tuple[str, ...] = ("x",),
              contiguous: bool = True, enabled: bool = True,
              placement: Placement = Placement.RESIDENT) -> ProgramSpec:
    """A spec whose input ``x`` (written back: the last output) is placed as the
    compile-time decision places it; ``g`` is a copied per-call input."""
    buffers = {name: BufferDecl(name, "float32", N, "input" if name in "xg" else "temp")
               for name in ("x", "g", "y")}
    outs = tuple(OutputDecl(name, (N,), (1,), 0, "float32") for name in (*outputs, "x"))
    inputs = (InputPlan(0, "x", placement, "float32", None, contiguous),
              InputPlan(1, "g", Placement.COPIED, "float32", None, True))
    inputs = place_mapped_updates(inputs, steps, outputs, in_place, enabled)
    return ProgramSpec("graph", buffers, tuple(steps), inputs, {}, outs, alignment=64,
                       writebacks=(0,))


def make_device() -> Device:
    return Device(DeviceConfig(memory_bytes=1 << 22))


def call(program: Program, x: np.ndarray, g: np.ndarray) -> None:
    """One call; the write-back of x needs no host array of its own when mapped."""
    back = None if 0 in program.mapped_updates else x
    program.run([x, g], [back], resident_keys={0: (id(x), x.sum())})


def test_an_input_its_kernel_updates_is_updated_in_host_memory():
    device = make_device()
    program = Program(device, make_spec([updating_x()]))
    assert program.mapped_updates == {0} and program.host_mapped == {0: "x"}
    assert "x" not in program.plan.offsets and "g" in program.plan.offsets
    x, g = np.arange(N, dtype=np.float32), np.ones(N, np.float32)
    want = x.copy()
    for _ in range(3):
        call(program, x, g)
        want = want * 2.0 + 1.0
        np.testing.assert_array_equal(x, want)
    st = device.dma_stats()
    assert (st["h2d.mapped_reads"], st["h2d.mapped_bytes"]) == (3, 3 * x.nbytes)
    assert (st["d2h.mapped_writes"], st["d2h.mapped_bytes"]) == (3, 3 * x.nbytes)
    assert st["d2h.bytes"] == 3 * x.nbytes and st["d2h.transfers"] == 3  # nothing copied
    assert st["h2d.bytes"] == 3 * (x.nbytes + g.nbytes)  # g copied, x read in place
    stats = device.runtime_stats()
    assert stats["resident_uploads"] == 0 and stats["kernel_launches"] == 3


def test_a_misaligned_host_array_is_updated_without_staging():
    """The kernel addresses the elements itself: no DMA descriptor, no alignment rule."""
    device = make_device()
    program = Program(device, make_spec([updating_x()]))
    x = np.arange(N + 1, dtype=np.float32)[1:]
    assert x.ctypes.data % 64
    want = x * 2.0
    g = np.zeros(2 * N, np.float32)
    g = g[-g.ctypes.data % 64 // 4:][:N]  # aligned: a direct copy
    call(program, x, g)
    np.testing.assert_array_equal(x, want)
    assert device.dma_stats()["staged.bytes"] == 0


def add_one(z: np.ndarray, x: np.ndarray) -> None:
    z[:] = x + 1.0


@pytest.mark.parametrize("case", ["two_kernels", "host_step_reads_it", "graph_output",
                                  "not_contiguous", "disabled", "not_in_place", "copied"])
def test_inputs_that_stay_as_they_were(case):
    steps, outputs, in_place, contiguous, enabled = [updating_x()], (), ("x",), True, True
    placement = Placement.RESIDENT
    if case == "two_kernels":
        steps.append(LaunchStep("add_one", add_one, ("y", "x"), (), N, 8 * N,
                                frozenset({"x"}), frozenset({"y"})))
    elif case == "host_step_reads_it":
        steps.append(HostStep("host", lambda h, sizes: add_one(h["y"], h["x"]), ("x",), ("y",)))
    elif case == "graph_output":
        outputs = ("x",)
    elif case == "not_contiguous":
        contiguous = False
    elif case == "disabled":
        enabled = False  # DeviceConfig.host_map_min_bytes == 0
    elif case == "not_in_place":
        in_place = ()
    else:
        placement = Placement.COPIED
    spec = make_spec(steps, outputs, in_place, contiguous, enabled, placement)
    assert spec.inputs[0].placement is placement
    program = Program(make_device(), spec)
    assert program.mapped_updates == frozenset()
    x = np.arange(N, dtype=np.float32)
    want = x * 2.0 + 1.0
    program.run([x, np.ones(N, np.float32)], [x] * len(spec.outputs),
                resident_keys={0: (id(x), 0)})
    np.testing.assert_array_equal(x, want)


def test_a_read_only_host_array_is_refused_and_the_next_call_works():
    program = Program(make_device(), make_spec([updating_x()]))
    frozen = np.arange(N, dtype=np.float32)
    frozen.flags.writeable = False
    with pytest.raises(SimAccelError, match="writeable float32.*read-only.*guard"):
        call(program, frozen, np.ones(N, np.float32))
    np.testing.assert_array_equal(frozen, np.arange(N, dtype=np.float32))
    x = np.zeros(N, np.float32)
    call(program, x, np.ones(N, np.float32))
    np.testing.assert_array_equal(x, np.ones(N, np.float32))


def test_the_same_host_array_binds_and_checks_once(monkeypatch):
    program = Program(make_device(), make_spec([updating_x()]))
    binds, checks = [], []
    real_bind, real_check = program_module.bind_launch, hostmap.check_mapped
    monkeypatch.setattr(program_module, "bind_launch",
                        lambda fn, args, *addresses: binds.append(fn) or real_bind(fn, args, *addresses))
    monkeypatch.setattr(hostmap, "check_mapped",
                        lambda *args: checks.append(args[0]) or real_check(*args))
    x, g = np.zeros(N, np.float32), np.ones(N, np.float32)
    for _ in range(3):
        call(program, x, g)
    assert (binds, checks) == ([double_in_place], ["input"])
    other = np.zeros(N, np.float32)
    call(program, other, g)
    np.testing.assert_array_equal(other, g)
    assert (binds, checks) == ([double_in_place] * 2, ["input", "input"])


def _plans(steps: list, aligned: bool | None = True) -> tuple[InputPlan, ...]:
    """The plans of ``x`` (updated in place) and the small copied ``g`` after both
    host-mapping decisions, updates first (as the backend takes them)."""
    inputs = (InputPlan(0, "x", Placement.RESIDENT, "float32", None, True),
              InputPlan(1, "g", Placement.COPIED, "float32", aligned, True))
    updated = place_mapped_updates(inputs, steps, (), ("x",), True)
    return place_mapped_inputs(updated, steps, (), {"x": 4 * N, "g": 4 * N}, 1 << 20)


def _placed(steps: list, aligned: bool | None = True) -> dict[str, Placement]:
    return {p.buffer: p.placement for p in _plans(steps, aligned)}


def test_a_small_input_beside_a_mapped_update_is_read_in_host_memory():
    """``g`` (1 KiB, far under the 1 MiB threshold) is read by the kernel that updates
    ``x`` in host memory: it is read there too. Read by a kernel that updates nothing in
    host memory, or not pinned aligned, it is copied as before."""
    assert _placed([updating_x()]) == {"x": Placement.MAPPED_UPDATE, "g": Placement.MAPPED}
    assert _placed([updating_x()], aligned=None)["g"] is Placement.COPIED
    reading_g = LaunchStep("scale", double_in_place, ("y", "g"), (), N, 12 * N,
                           frozenset({"y", "g"}), frozenset({"y"}))
    assert _placed([reading_g])["g"] is Placement.COPIED


def test_a_gradient_read_in_host_memory_is_read_as_it_is_each_call():
    """The program over the mapped ``x`` and ``g``: a new ``g`` array each call, and one
    changed in place, are what the kernel reads; nothing is copied in."""
    steps = [updating_x()]
    buffers = {name: BufferDecl(name, "float32", N, "input") for name in ("x", "g")}
    spec = ProgramSpec("graph", buffers, tuple(steps), _plans(steps), {},
                       (OutputDecl("x", (N,), (1,), 0, "float32"),), alignment=64,
                       writebacks=(0,))
    device = make_device()
    program = Program(device, spec)
    assert program.host_mapped == {0: "x", 1: "g"}
    x = np.zeros(N, np.float32)
    want = x.copy()
    g = aligned_array(np.ones(N, np.float32))
    for k in range(4):
        if k == 1:
            g = aligned_array(np.full(N, 3.0, np.float32))  # a new array
        if k == 3:
            g[:] = -1.0  # the same array, changed in place
        call(program, x, g)
        want = want * 2.0 + g
        np.testing.assert_array_equal(x, want)
    assert device.dma_stats()["h2d.bytes"] == device.dma_stats()["h2d.mapped_bytes"]

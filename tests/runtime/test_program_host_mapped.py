"""Host-mapped inputs at the runtime level: which inputs the compile-time decision
(:func:`place_mapped_inputs`) lets a kernel read in place, the Program's workspace plan
without them, binding to the host arrays, the per-call checks, and the decision staying
part of the frozen spec. Programs are built by hand from numpy kernels; results are
compared with numpy."""
from __future__ import annotations

import numpy as np
import pytest

import simaccel.runtime.program as program_module
from simaccel.errors import SimAccelError
from simaccel.runtime.config import DeviceConfig
from simaccel.runtime.device import Device
from simaccel.runtime.hostmap import place_mapped_inputs
from simaccel.runtime.program import Program
from simaccel.runtime.spec import (BufferDecl, HostStep, InputPlan, LaunchStep, OutputDecl,
                                   Placement, ProgramSpec)

N = 1024  # float32 elements: 4096 bytes
MIN_BYTES = 4096


def scale(y: np.ndarray, x: np.ndarray) -> None:
    y[:] = x * 2.0


def add_one(z: np.ndarray, x: np.ndarray) -> None:
    z[:] = x + 1.0


def make_spec(steps: list, outputs: tuple[str, ...] = ("y",), aligned: bool | None = True,
              contiguous: bool = True, min_bytes: int = MIN_BYTES,
              placement: Placement = Placement.COPIED) -> ProgramSpec:
    """A spec whose input ``x`` is placed as the compile-time decision places it."""
    buffers = {name: BufferDecl(name, "float32", N, "input" if name == "x" else "temp")
               for name in ("x", "y", "z")}
    outs = tuple(OutputDecl(name, (N,), (1,), 0, "float32") for name in outputs)
    inputs = (InputPlan(0, "x", placement, "float32", aligned, contiguous),)
    inputs = place_mapped_inputs(inputs, steps, outputs, {"x": N * 4}, min_bytes)
    return ProgramSpec("graph", buffers, tuple(steps), inputs, {}, outs, alignment=64)


def reading_x(writes: tuple[str, ...] = ("y",)) -> LaunchStep:
    return LaunchStep("scale", scale, ("y", "x"), (), N, 8 * N, frozenset({"x"}),
                      frozenset(writes))


def aligned_array(values: np.ndarray, alignment: int = 64) -> np.ndarray:
    """A C-contiguous copy of ``values`` whose data pointer is a multiple of ``alignment``."""
    raw = np.empty(values.nbytes + alignment, np.uint8)
    skip = -raw.ctypes.data % alignment
    out = raw[skip:skip + values.nbytes].view(values.dtype).reshape(values.shape)
    out[...] = values
    return out


def make_device(min_bytes: int = MIN_BYTES) -> Device:
    return Device(DeviceConfig(memory_bytes=1 << 22, host_map_min_bytes=min_bytes))


def run(program: Program, x: np.ndarray) -> np.ndarray:
    out = np.zeros(N, np.float32)
    program.run([x], [out])
    return out


def test_a_large_input_read_by_one_kernel_is_read_in_place():
    device = make_device()
    program = Program(device, make_spec([reading_x()]))
    copied = Program(make_device(0), make_spec([reading_x()], min_bytes=0))
    assert program.host_mapped == {0: "x"} and copied.host_mapped == {}
    assert "x" not in program.plan.offsets and "x" in copied.plan.offsets
    assert program.plan.total_bytes == copied.plan.total_bytes - N * 4
    x = aligned_array(np.arange(N, dtype=np.float32))
    for _ in range(3):
        np.testing.assert_array_equal(run(program, x), x * 2.0)
    st = device.dma_stats()
    assert (st["h2d.mapped_bytes"], st["h2d.mapped_reads"]) == (3 * x.nbytes, 3)
    assert (st["h2d.bytes"], st["h2d.transfers"]) == (3 * x.nbytes, 3)
    assert device.runtime_stats()["kernel_launches"] == 3


@pytest.mark.parametrize("case", ["kernel_writes_it", "two_kernels", "host_step_reads_it",
                                  "graph_output", "staged_plan", "unplanned", "not_contiguous",
                                  "small", "resident"])
def test_inputs_that_are_copied_as_before(case):
    steps, outputs, aligned, min_bytes, contiguous = [reading_x()], ("y",), True, MIN_BYTES, True
    placement = Placement.COPIED
    if case == "kernel_writes_it":
        steps = [reading_x(writes=("y", "x"))]
    elif case == "two_kernels":
        steps.append(LaunchStep("add_one", add_one, ("z", "x"), (), N, 8 * N, frozenset({"x"}),
                                frozenset({"z"})))
    elif case == "host_step_reads_it":
        steps.append(HostStep("host", lambda h, sizes: add_one(h["z"], h["x"]), ("x",), ("z",)))
    elif case == "graph_output":
        outputs = ("y", "x")
    elif case == "staged_plan":
        aligned = False
    elif case == "unplanned":
        aligned = None  # alignment decided per call: no plan to rely on
    elif case == "not_contiguous":
        contiguous = False  # a strided host layout: the copy gathers it
    elif case == "resident":
        placement = Placement.RESIDENT  # uploaded once, never mapped
    else:
        min_bytes = N * 4 + 1
    device = make_device(min_bytes)
    program = Program(device, make_spec(steps, outputs, aligned, contiguous, min_bytes, placement))
    assert program.host_mapped == {}
    assert ("x" in program.plan.offsets) == (placement is Placement.COPIED)
    x = aligned_array(np.arange(N, dtype=np.float32))
    if not aligned:
        x = np.arange(N + 1, dtype=np.float32)[1:]  # what a staged plan is compiled for
    if not contiguous:
        x = aligned_array(np.arange(2 * N, dtype=np.float32))[::2]  # every other element
    outs = [np.zeros(N, np.float32) for _ in outputs]
    program.run([x], outs)
    np.testing.assert_array_equal(outs[0], x * 2.0)
    assert device.dma_stats()["h2d.mapped_bytes"] == 0
    assert device.dma_stats()["h2d.bytes"] >= x.nbytes


def test_the_same_host_array_binds_once_and_a_new_one_rebinds(monkeypatch):
    program = Program(make_device(), make_spec([reading_x()]))
    binds = []
    real_bind = program_module.bind_launch
    monkeypatch.setattr(program_module, "bind_launch",
                        lambda fn, args, *addresses: binds.append(fn) or real_bind(fn, args, *addresses))
    x = aligned_array(np.ones(N, np.float32))
    for _ in range(3):
        np.testing.assert_array_equal(run(program, x), x * 2.0)
        np.testing.assert_array_equal(run(program, x.view()), x * 2.0)  # same address
    assert binds == [scale]
    for k in range(3):
        fresh = aligned_array(np.full(N, float(k), np.float32))
        np.testing.assert_array_equal(run(program, fresh), fresh * 2.0)
    assert binds == [scale] * 4


def test_a_mapped_input_address_the_caller_does_not_know_is_read_from_the_array():
    """The caller passes each tensor's data address where it knows it (0 where it does
    not): a kernel reading in place is pointed at the array's own address either way."""
    program = Program(make_device(), make_spec([reading_x()]))
    out = np.zeros(N, np.float32)
    for value, known in ((1.0, True), (2.0, False), (3.0, True), (4.0, False)):
        x = aligned_array(np.full(N, value, np.float32))
        out[:] = 0
        program.run([x], [out], None, [x.ctypes.data if known else 0])
        np.testing.assert_array_equal(out, x * 2.0)


def test_a_mapped_input_breaking_the_compiled_layout_raises():
    program = Program(make_device(), make_spec([reading_x()]))
    grid = aligned_array(np.arange(N, dtype=np.float32).reshape(32, 32))
    np.testing.assert_array_equal(run(program, grid), grid.reshape(-1) * 2.0)
    for bad in (grid.T, aligned_array(grid.astype(np.int32)),
                aligned_array(np.zeros(N // 2, np.float32))):
        with pytest.raises(SimAccelError, match="host-mapped.*guard should have recompiled"):
            run(program, bad)


def test_mapping_is_part_of_the_frozen_spec_and_kept_across_a_reconfigure():
    """The decision is taken at compile time; a reconfigure (the frame's device-config
    guard recompiles a frame for the new threshold) re-uploads but does not re-plan."""
    device = make_device()
    program = Program(device, make_spec([reading_x()]))
    plan = program.plan
    x = aligned_array(np.arange(N, dtype=np.float32))
    np.testing.assert_array_equal(run(program, x), x * 2.0)
    device.reconfigure(device.config.replace(host_map_min_bytes=0))
    np.testing.assert_array_equal(run(program, x), x * 2.0)
    assert program.host_mapped == {0: "x"} and program.plan is plan
    assert device.dma_stats()["h2d.mapped_reads"] == 2
    assert device.runtime_stats()["memory_plans"] == 1


def test_a_spec_planned_for_another_alignment_is_refused_with_the_reason():
    device = make_device()
    program = Program(device, make_spec([reading_x()]))
    x = aligned_array(np.arange(N, dtype=np.float32))
    run(program, x)
    device.reconfigure(device.config.replace(alignment=128))
    with pytest.raises(SimAccelError, match="planned for a device alignment of 64 bytes.*128"):
        run(program, x)
    device.reconfigure(device.config.replace(alignment=64))
    np.testing.assert_array_equal(run(program, x), x * 2.0)  # usable again
    with pytest.raises(SimAccelError, match="alignment"):
        Program(Device(DeviceConfig(memory_bytes=1 << 22, alignment=128)),
                make_spec([reading_x()]))


def _gemm_halves_spec(first_rows: int) -> ProgramSpec:
    """``x`` (32 x 32) times ``w`` (32 x 32) by two library GEMMs: y = x[:first_rows] @ w
    and z = x[16:] @ w (disjoint rows of x when ``first_rows`` is 16, overlapping past)."""
    from simaccel.codegen import library
    buffers = {name: BufferDecl(name, "float32", N, kind) for name, kind in
               (("x", "input"), ("w", "input"), ("y", "temp"), ("z", "temp"))}
    steps = (LaunchStep("gemm_a", library.gemm, ("y", "x", "w"),
                        (1, first_rows, 32, 32, 0, 0, 0, 0, 0, 0), 0, 0,
                        frozenset({"x", "w"}), frozenset({"y"})),
             LaunchStep("gemm_b", library.gemm, ("z", "x", "w"),
                        (1, 16, 32, 32, 16 * 32, 0, 0, 0, 0, 0), 0, 0,
                        frozenset({"x", "w"}), frozenset({"z"})))
    inputs = tuple(InputPlan(i, name, Placement.COPIED, "float32", True, True)
                   for i, name in enumerate(("x", "w")))
    inputs = place_mapped_inputs(inputs, steps, ("y", "z"), {"x": N * 4, "w": N * 4},
                                 MIN_BYTES)
    outs = (OutputDecl("y", (first_rows * 32,), (1,), 0, "float32"),
            OutputDecl("z", (16 * 32,), (1,), 0, "float32"))
    return ProgramSpec("graph", buffers, steps, inputs, {}, outs, alignment=64)


@pytest.mark.parametrize("first_rows, mapped", [(16, {0: "x"}), (20, {})])
def test_an_input_library_gemms_read_in_disjoint_parts_is_read_in_place(first_rows, mapped):
    """x's halves are each read by their own GEMM, so each element crosses the bus once
    (causal attention's key and value halves); overlapping reads copy it, as does w, read
    whole by both."""
    program = Program(make_device(), _gemm_halves_spec(first_rows))
    assert program.host_mapped == mapped
    rng = np.random.default_rng(0)
    for _ in range(2):  # new contents each call: the mapped launches read them
        x = aligned_array(rng.standard_normal(N).astype(np.float32))
        w = aligned_array(rng.standard_normal(N).astype(np.float32))
        y, z = np.zeros(first_rows * 32, np.float32), np.zeros(16 * 32, np.float32)
        program.run([x, w], [y, z])
        xs, ws = x.reshape(32, 32), w.reshape(32, 32)
        np.testing.assert_allclose(y, (xs[:first_rows] @ ws).reshape(-1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(z, (xs[16:] @ ws).reshape(-1), rtol=1e-5, atol=1e-5)

"""A program call lands on the device timeline as one record (DmaEngine.record_call): the
same spans, in the same order, and the same counters as its batches and kernels placed
one by one; a call that fails part way records what moved and ran, and the next call
works. Programs are built by hand from numpy kernels; results are compared with numpy."""
from __future__ import annotations

import numpy as np
import pytest

from simaccel.runtime.config import DeviceConfig
from simaccel.runtime.device import Device
from simaccel.runtime.program import Program
from simaccel.runtime.spec import (BufferDecl, HostStep, InputPlan, LaunchStep, OutputDecl,
                                   Placement, ProgramSpec)

N = 64  # float32 elements: 256 bytes


def scale(t: np.ndarray, x: np.ndarray) -> None:
    t[:] = x * 3.0


def shift(y: np.ndarray, t: np.ndarray) -> None:
    if t[0] == 123.0:  # the failing input of the error test
        raise ValueError("kernel failed on purpose")
    y[:] = t + 1.0


def negate_on_host(bufs: dict[str, np.ndarray], sizes: dict[str, int]) -> None:
    bufs["y"][:] = -bufs["t"]


def make_program(host_step: bool = False) -> Program:
    """y = x * 3 + 1 as two kernels (or, with ``host_step``, y = -(x * 3) as a kernel and
    a host fallback step)."""
    buffers = {"x": BufferDecl("x", "float32", N, "input"),
               "t": BufferDecl("t", "float32", N, "temp"),
               "y": BufferDecl("y", "float32", N, "output")}
    first = LaunchStep("scale", scale, ("t", "x"), (), N, 8 * N, frozenset({"x"}),
                       frozenset({"t"}))
    second = (HostStep("negate", negate_on_host, frozenset({"t"}), frozenset({"y"}))
              if host_step else
              LaunchStep("shift", shift, ("y", "t"), (), N, 8 * N, frozenset({"t"}),
                         frozenset({"y"})))
    spec = ProgramSpec("graph", buffers, (first, second),
                       (InputPlan(0, "x", Placement.COPIED, "float32", None, True),), {},
                       (OutputDecl("y", (N,), (1,), 0, "float32"),), alignment=64)
    return Program(Device(DeviceConfig(memory_bytes=1 << 22)), spec)


def run(program: Program, x: np.ndarray) -> np.ndarray:
    out = np.empty(N, np.float32)
    program.run([x], [out])
    return out


def test_a_call_is_its_copies_and_kernels_in_order_counted_once_each():
    program = make_program()
    x = np.arange(N, dtype=np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(run(program, x), x * 3.0 + 1.0)
    dma = program.device.dma
    stats = dma.stats()
    assert (stats["h2d.transfers"], stats["d2h.transfers"], stats["compute_items"]) == (3, 3, 6)
    assert (stats["h2d.bytes"], stats["d2h.bytes"]) == (3 * 4 * N, 3 * 4 * N)
    events = dma.trace_events()
    assert [e.name for e in events] == ["h2d x", "scale", "shift", "d2h y"] * 3
    for call in range(3):  # within a call, each waits for the one before
        mine = events[4 * call:4 * call + 4]
        for before, after in zip(mine, mine[1:]):
            assert after.start_ns >= before.start_ns + before.dur_ns - 1e-6
    assert program.device.runtime_stats()["kernel_launches"] == 6


def test_a_program_with_a_host_step_records_uploads_steps_and_download():
    program = make_program(host_step=True)
    x = np.arange(N, dtype=np.float32)
    np.testing.assert_array_equal(run(program, x), -(x * 3.0))
    names = [e.name for e in program.device.dma.trace_events()]
    assert names == ["h2d x", "scale", "d2h t", "h2d y", "d2h y"]
    assert program.device.runtime_stats()["host_fallback_ops"] == 1


def test_a_failing_kernel_records_what_ran_and_the_next_call_works():
    program = make_program()
    bad = np.full(N, 41.0, np.float32)  # 41 * 3 == 123: shift raises
    with pytest.raises(ValueError, match="on purpose"):
        run(program, bad)
    dma = program.device.dma
    stats = dma.stats()
    assert (stats["h2d.transfers"], stats["compute_items"], stats["d2h.transfers"]) == (1, 1, 0)
    assert [e.name for e in dma.trace_events()] == ["h2d x", "scale"]
    x = np.ones(N, np.float32)
    np.testing.assert_array_equal(run(program, x), x * 3.0 + 1.0)
    assert [e.name for e in dma.trace_events()][2:] == ["h2d x", "scale", "shift", "d2h y"]


def test_a_bad_output_array_records_the_call_and_stops_at_the_download():
    """The first call's arrays make the call's DMA plans: a bad one must not be kept."""
    program = make_program()
    x = np.ones(N, np.float32)
    with pytest.raises(ValueError):
        program.run([x], [np.empty(N, np.float64)])  # not the planned dtype
    stats = program.device.dma.stats()
    assert (stats["h2d.transfers"], stats["compute_items"], stats["d2h.bytes"]) == (1, 2, 0)
    np.testing.assert_array_equal(run(program, x), x * 3.0 + 1.0)


def test_call_counts_add_up_over_live_and_collected_programs_and_reset():
    """A program counts its calls without the device's lock; the device adds every
    program's counts up, keeps those of a program that was collected, and zeroes them."""
    import gc

    program = make_program()
    device = program.device
    x = np.ones(N, np.float32)
    for _ in range(3):
        run(program, x)
    stats = device.runtime_stats()
    assert (stats["calls"], stats["kernel_launches"]) == (3, 6) and stats["kernel_wall_ns"] > 0
    other = Program(device, program.spec)
    run(other, x)
    del program
    gc.collect()
    stats = device.runtime_stats()
    assert (stats["calls"], stats["kernel_launches"]) == (4, 8)
    with pytest.raises(ValueError, match="on purpose"):
        run(other, np.full(N, 41.0, np.float32))  # a failed call is not counted
    assert device.runtime_stats()["calls"] == 4
    device.reset_stats()
    assert (device.runtime_stats()["calls"], device.runtime_stats()["kernel_launches"]) == (0, 0)
    run(other, x)
    assert device.runtime_stats()["calls"] == 1


def test_staging_flags_stage_a_misaligned_input_beside_an_empty_one():
    from simaccel.runtime.staging import staging_flags
    plans = [InputPlan(0, "a", Placement.COPIED, "float32", None, True),
             InputPlan(1, "b", Placement.COPIED, "float32", None, True),
             InputPlan(2, "c", Placement.COPIED, "float32", None, True)]
    base = np.zeros(64, np.float32)
    misaligned = base[1:9]  # 4 bytes past a 64-byte boundary at most
    if misaligned.__array_interface__["data"][0] % 64 == 0:
        misaligned = base[2:10]
    hosts = [np.zeros(0, np.float32), misaligned, misaligned]
    flags, empty = staging_flags(plans, hosts, [False, False, True], None, 64)
    assert flags == (False, True, False) and empty  # the updated one takes no descriptor

"""Replayed calls (simaccel.runtime.replay): after a binding's first call went the general
way, later calls replay its record. A replayed call must give the same results, the same
device timeline, trace and counters as the general call; a call the record does not fit
(a misaligned input, another shape or dtype) goes the general way; a kernel that raises
in a replay records what ran, and the next call works. Programs are built by hand from
numpy kernels; results are compared with numpy."""
from __future__ import annotations

import numpy as np
import pytest

from simaccel.runtime.config import DeviceConfig
from simaccel.runtime.device import Device
from simaccel.runtime.hostmap import place_mapped_updates
from simaccel.runtime.program import Program
from simaccel.runtime.replay import Replay
from simaccel.runtime.spec import (BufferDecl, InputPlan, LaunchStep, OutputDecl, Placement,
                                   ProgramSpec)

N = 64  # float32 elements: 256 bytes


def scale(t: np.ndarray, x: np.ndarray, s: np.ndarray) -> None:
    t[:] = x * s[0]


def shift(y: np.ndarray, t: np.ndarray) -> None:
    if t[0] == 123.0:  # the failing input of the error test
        raise ValueError("kernel failed on purpose")
    y[:] = t + 1.0


def momentum(p: np.ndarray, b: np.ndarray, g: np.ndarray, s: np.ndarray) -> None:
    b[:] = b * 0.5 + g
    p[:] = p - s[0] * b


def scaled_program(device: Device) -> Program:
    """y = x * s + 1 (``s``: a lifted scalar in the constant bank) as two kernels."""
    buffers = {"x": BufferDecl("x", "float32", N, "input"),
               "s": BufferDecl("s", "float32", 1, "scalar"),
               "t": BufferDecl("t", "float32", N, "temp"),
               "y": BufferDecl("y", "float32", N, "output")}
    steps = (LaunchStep("scale", scale, ("t", "x", "s"), (), N, 8 * N,
                        frozenset({"x", "s"}), frozenset({"t"})),
             LaunchStep("shift", shift, ("y", "t"), (), N, 8 * N, frozenset({"t"}),
                        frozenset({"y"})))
    inputs = (InputPlan(0, "x", Placement.COPIED, "float32", None, True),
              InputPlan(1, "s", Placement.BANK, "float32"))
    spec = ProgramSpec("graph", buffers, steps, inputs, {},
                       (OutputDecl("y", (N,), (1,), 0, "float32"),), alignment=64)
    return Program(device, spec)


def momentum_program(device: Device) -> Program:
    """An optimizer-like step: p and b updated in place in host memory (mapped updates,
    written back), g copied, lr from the constant bank."""
    buffers = {n: BufferDecl(n, "float32", N, "input") for n in "pbg"}
    buffers["s"] = BufferDecl("s", "float32", 1, "scalar")
    steps = [LaunchStep("momentum", momentum, ("p", "b", "g", "s"), (), N, 20 * N,
                        frozenset("pbgs"), frozenset("pb"))]
    inputs = (InputPlan(0, "p", Placement.RESIDENT, "float32", None, True),
              InputPlan(1, "b", Placement.RESIDENT, "float32", None, True),
              InputPlan(2, "g", Placement.COPIED, "float32", None, True),
              InputPlan(3, "s", Placement.BANK, "float32"))
    inputs = place_mapped_updates(inputs, steps, (), ("p", "b"), True)
    outs = tuple(OutputDecl(n, (N,), (1,), 0, "float32") for n in "pb")
    spec = ProgramSpec("step", buffers, tuple(steps), inputs, {}, outs, alignment=64,
                       writebacks=(0, 1))
    return Program(device, spec)


def aligned(values: np.ndarray) -> np.ndarray:
    """A copy of ``values`` at a 64-byte aligned address (as torch allocates; numpy
    aligns to 16 bytes only, and a misaligned input is staged: the general path)."""
    base = np.empty(values.size + 16, values.dtype)
    start = (-base.__array_interface__["data"][0] % 64) // values.itemsize
    out = base[start:start + values.size]
    out[:] = values
    return out


def make_device() -> Device:
    return Device(DeviceConfig(memory_bytes=1 << 22, dma_channels=2))


def never_replay(program: Program) -> None:
    """Make every later call of ``program`` go the general way (its bindings' record is
    marked as not replayable)."""
    for bound in program._bound.values():
        bound.replay = False


def timeline(device: Device) -> list[tuple]:
    return [(e.name, e.tid, e.start_ns, e.dur_ns) for e in device.dma.trace_events()]


def run_scaled(program: Program, x: np.ndarray, s: float) -> np.ndarray:
    out = np.empty(N, np.float32)
    program.run([x, s], [out])
    return out


def test_replayed_calls_equal_general_calls_in_results_timeline_and_counters():
    """The same calls (the scalar changing every other call) on two devices, one always
    the general way: equal outputs, spans, DMA counters and runtime counters."""
    replayed, general = scaled_program(make_device()), scaled_program(make_device())
    scalars = [2.0, 2.0, 3.0, 3.0, -1.5, 0.0, 0.0]
    for k, s in enumerate(scalars):
        x = aligned(np.arange(N, dtype=np.float32) + k)
        want = x * np.float32(s) + 1.0
        np.testing.assert_array_equal(run_scaled(replayed, x, s), want)
        np.testing.assert_array_equal(run_scaled(general, x, s), want)
        never_replay(general)
    assert isinstance(replayed._bound[()].replay, Replay)
    assert timeline(replayed.device) == timeline(general.device)
    assert replayed.device.dma_stats() == general.device.dma_stats()
    stats, general_stats = replayed.device.runtime_stats(), general.device.runtime_stats()
    assert stats["replayed_calls"] == len(scalars) - 1 and general_stats["replayed_calls"] == 0
    for key in ("calls", "kernel_launches", "host_fallback_ops"):
        assert stats[key] == general_stats[key]


def test_a_replayed_optimizer_step_updates_host_memory_as_the_general_one():
    replayed, general = momentum_program(make_device()), momentum_program(make_device())
    assert replayed.mapped_updates == {0, 1}
    rng = np.random.default_rng(0)
    states = [[aligned(rng.standard_normal(N).astype(np.float32)) for _ in "pb"]]
    states.append([aligned(a) for a in states[0]])
    want_p, want_b = states[0][0].copy(), states[0][1].copy()
    for step in range(5):
        g = aligned(rng.standard_normal(N).astype(np.float32))
        lr = 0.1 / (1 + step)
        want_b = want_b * np.float32(0.5) + g
        want_p = want_p - np.float32(lr) * want_b
        for program, (p, b) in zip((replayed, general), states):
            program.run([p, b, g, lr], [None, None])
            np.testing.assert_allclose(p, want_p, rtol=1e-6)
            np.testing.assert_allclose(b, want_b, rtol=1e-6)
        never_replay(general)
    assert replayed.device.runtime_stats()["replayed_calls"] == 4
    assert timeline(replayed.device) == timeline(general.device)
    assert replayed.device.dma_stats() == general.device.dma_stats()


def test_the_same_arrays_again_replay_unchecked_and_new_ones_are_checked_and_bound():
    """Kept views pass the very same arrays every call: the record's input checks and the
    mapped launches' binding are skipped for them, and still see in-place changes; a
    misaligned gradient goes the general way, a new parameter array is bound anew."""
    program = momentum_program(make_device())
    rng = np.random.default_rng(1)
    p, b, g = (aligned(rng.standard_normal(N).astype(np.float32)) for _ in "pbg")
    want_p, want_b = p.copy(), b.copy()

    def step(p_arr: np.ndarray, g_arr: np.ndarray) -> None:
        nonlocal want_p, want_b
        want_b = want_b * np.float32(0.5) + g_arr
        want_p = want_p - np.float32(0.1) * want_b
        program.run([p_arr, b, g_arr, 0.1], [None, None])
        np.testing.assert_allclose(p_arr, want_p, rtol=1e-6)
        np.testing.assert_allclose(b, want_b, rtol=1e-6)
    for _ in range(3):
        g[:] = rng.standard_normal(N)  # written in place, as an accumulated gradient
        step(p, g)
    bound = program._bound[()]
    assert bound.replay.accepted is not None and bound.mapped_sources is not None
    odd = misaligned(N)
    odd[:] = g
    step(p, odd)  # checked again: staged, the general way
    assert program.device.dma_stats()["staged.bytes"] == g.nbytes
    moved, before = aligned(p), p.copy()
    step(moved, g)  # another parameter array: the launch is bound to it, not to p
    step(moved, g)
    np.testing.assert_array_equal(p, before)
    assert program.device.runtime_stats()["replayed_calls"] == 4


def test_a_replay_remembers_no_large_array(monkeypatch):
    """Arrays above REMEMBER_MAX_BYTES are checked on every call, never held between
    calls (a caller's large tensor is freed when the caller drops it)."""
    from simaccel.runtime import replay
    monkeypatch.setattr(replay, "REMEMBER_MAX_BYTES", 0)
    program = scaled_program(make_device())
    x = aligned(np.arange(N, dtype=np.float32))
    for _ in range(3):
        np.testing.assert_array_equal(run_scaled(program, x, 2.0), x * 2 + 1)
    assert program._bound[()].replay.accepted is None
    assert program.device.runtime_stats()["replayed_calls"] == 2


def misaligned(n: int) -> np.ndarray:
    base = np.zeros(n + 16, np.float32)
    start = next(k for k in range(1, 16) if base[k:].__array_interface__["data"][0] % 64)
    return base[start:start + n]


def test_a_call_the_record_does_not_fit_goes_the_general_way():
    """A misaligned input is staged (the general path), then aligned calls replay again."""
    program = scaled_program(make_device())
    x = aligned(np.arange(N, dtype=np.float32))
    run_scaled(program, x, 2.0)
    odd = misaligned(N)
    odd[:] = x
    np.testing.assert_array_equal(run_scaled(program, odd, 2.0), x * 2 + 1)
    assert program.device.dma_stats()["staged.bytes"] == x.nbytes
    assert program.device.runtime_stats()["replayed_calls"] == 0
    np.testing.assert_array_equal(run_scaled(program, x, 2.0), x * 2 + 1)
    assert program.device.runtime_stats()["replayed_calls"] == 1


def test_a_bad_array_after_the_record_gets_the_general_error_and_the_device_stays_usable():
    program = scaled_program(make_device())
    x = aligned(np.ones(N, np.float32))
    run_scaled(program, x, 2.0)
    with pytest.raises(ValueError, match="DMA copy"):
        program.run([np.ones(N, np.float64), 2.0], [np.empty(N, np.float32)])
    with pytest.raises(ValueError):
        program.run([x, 2.0], [np.empty(N // 2, np.float32)])  # an output of another size
    read_only = aligned(np.zeros(N, np.float32))
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        program.run([x, 2.0], [read_only])
    np.testing.assert_array_equal(run_scaled(program, x, 2.0), x * 2 + 1)
    assert program.device.runtime_stats()["replayed_calls"] == 1
    assert program.device.memory_stats()["active_bytes.all.current"] > 0


def test_a_kernel_raising_in_a_replay_records_what_ran_and_the_next_call_works():
    program = scaled_program(make_device())
    x = aligned(np.ones(N, np.float32))
    run_scaled(program, x, 3.0)
    before = program.device.dma_stats()
    with pytest.raises(ValueError, match="on purpose"):
        run_scaled(program, aligned(np.full(N, 41.0, np.float32)), 3.0)  # 41 * 3: shift raises
    after = program.device.dma_stats()
    assert after["h2d.transfers"] - before["h2d.transfers"] == 1
    assert after["compute_items"] - before["compute_items"] == 1
    assert after["d2h.transfers"] == before["d2h.transfers"]
    assert [e.name for e in program.device.dma.trace_events()][-2:] == ["h2d x", "scale"]
    np.testing.assert_array_equal(run_scaled(program, x, 3.0), x * 3 + 1)
    assert program.device.runtime_stats()["replayed_calls"] == 1


def test_a_scalar_its_slot_cannot_hold_stops_a_replay_after_the_input_moved():
    """As in the general call: the inputs moved (recorded), then the bank refuses."""
    from simaccel.errors import SimAccelError
    replayed, general = scaled_program(make_device()), scaled_program(make_device())
    x = aligned(np.ones(N, np.float32))
    for program in (replayed, general):
        run_scaled(program, x, 2.0)
    never_replay(general)
    for program in (replayed, general):
        with pytest.raises(SimAccelError, match="does not fit"):
            run_scaled(program, x, 1e300)  # beyond float32
        np.testing.assert_array_equal(run_scaled(program, x, 2.0), x * 2 + 1)
    assert replayed.device.dma_stats() == general.device.dma_stats()
    assert timeline(replayed.device) == timeline(general.device)

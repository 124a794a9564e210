"""Direct replays (simaccel.runtime.direct): a program's steady call entered from its
caller, outputs made by the caller from the device views. A direct call must
give the results, timeline, trace and counters of the general replay; once the state it
was made in changed (device reconfigured, workspace released, a kernel's new tier) or an input
does not fit the record, it returns None with nothing moved, and the general call runs.
Programs are built by hand from numpy kernels (tests/runtime/test_replay.py); results are
compared with numpy."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simaccel.runtime import tiers
from simaccel.runtime.direct import DirectReplay, direct_possible, direct_replay
from simaccel.runtime.program import Program
from tests.runtime.test_replay import (N, aligned, make_device, misaligned, momentum_program,
                                       run_scaled, scaled_program, timeline)


def copies_of(direct: DirectReplay):
    """A ``download`` appending a copy of each device output (as a compiled graph's
    clones do)."""
    sources = direct.sources()

    def download(outputs: list) -> None:
        outputs.extend(src.copy() for src in sources)
    return download


def call(direct: DirectReplay, x: np.ndarray, s: float) -> list | None:
    """A direct call on ``x`` and scalar ``s``, downloading copies of the outputs."""
    return direct([x, s], None, direct.program.layout_for([x, s]), copies_of(direct))


def direct_of(program: Program) -> DirectReplay | None:
    """The program's direct replay at its one (static) layout."""
    return direct_replay(program, program.layout_for([]))


def direct_after_record(program: Program, x: np.ndarray, s: float) -> DirectReplay:
    """The program's direct replay after the general call that records its replay."""
    assert direct_of(program) is None  # no binding yet
    run_scaled(program, x, s)
    direct = direct_of(program)
    assert isinstance(direct, DirectReplay)
    return direct


def test_direct_calls_equal_general_replays_in_results_timeline_and_counters():
    """The same calls on two devices, one replayed directly after the first call and
    one through Program.run, the scalar changing every other call."""
    direct_program, general = scaled_program(make_device()), scaled_program(make_device())
    x = aligned(np.arange(N, dtype=np.float32))
    direct = direct_after_record(direct_program, x, 2.0)
    direct_after_record(general, x, 2.0)
    for k, s in enumerate([2.0, 3.0, 3.0, -1.5, 0.0]):
        x[:] = np.arange(N, dtype=np.float32) + k  # the same array, new contents
        want = x * np.float32(s) + 1.0
        (out,) = call(direct, x, s)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(run_scaled(general, x, s), want)
    assert timeline(direct_program.device) == timeline(general.device)
    assert direct_program.device.dma_stats() == general.device.dma_stats()
    stats, general_stats = (direct_program.device.runtime_stats(),
                            general.device.runtime_stats())
    for key in ("calls", "replayed_calls", "kernel_launches", "host_fallback_ops"):
        assert stats[key] == general_stats[key]
    assert stats["replayed_calls"] == 5  # every call after the first


def test_a_new_input_array_is_checked_and_a_misfit_returns_none_with_nothing_moved():
    program = scaled_program(make_device())
    x = aligned(np.ones(N, np.float32))
    direct = direct_after_record(program, x, 2.0)
    other = aligned(np.full(N, 2.0, np.float32))
    np.testing.assert_array_equal(call(direct, other, 2.0)[0], other * 2 + 1)
    before = program.device.dma_stats()
    odd = misaligned(N)
    odd[:] = x
    for misfit in (odd, aligned(np.ones(N // 2, np.float32)), np.ones(N, np.float64)):
        assert call(direct, misfit, 2.0) is None
    assert program.device.dma_stats() == before
    np.testing.assert_array_equal(run_scaled(program, odd, 2.0), x * 2 + 1)  # staged
    np.testing.assert_array_equal(call(direct, x, 2.0)[0], x * 2 + 1)


@pytest.mark.parametrize("change", ["device reconfigured", "workspace released", "kernel tier"])
def test_a_changed_state_returns_none_and_the_general_call_makes_it_anew(change):
    program = scaled_program(make_device())
    x = aligned(np.ones(N, np.float32))
    direct = direct_after_record(program, x, 2.0)
    if change == "device reconfigured":
        config = program.device.config  # a new arena and DMA engine
        program.device.reconfigure(dataclasses.replace(config, dma_latency_ns=900.0))
    elif change == "workspace released":
        assert program.release_workspace() > 0
    else:
        tiers.bump()
    assert call(direct, x, 2.0) is None
    np.testing.assert_array_equal(run_scaled(program, x, 2.0), x * 2 + 1)
    again = direct_of(program)
    assert again is not direct
    np.testing.assert_array_equal(call(again, x, 3.0)[0], x * 3 + 1)


def test_a_kernel_raising_in_a_direct_call_records_what_ran_and_the_next_call_works():
    program = scaled_program(make_device())
    x = aligned(np.ones(N, np.float32))
    direct = direct_after_record(program, x, 3.0)
    before = program.device.dma_stats()
    with pytest.raises(ValueError, match="on purpose"):
        call(direct, aligned(np.full(N, 41.0, np.float32)), 3.0)  # shift raises
    after = program.device.dma_stats()
    assert after["h2d.transfers"] - before["h2d.transfers"] == 1
    assert after["compute_items"] - before["compute_items"] == 1
    assert after["d2h.transfers"] == before["d2h.transfers"]
    np.testing.assert_array_equal(call(direct, x, 3.0)[0], x * 3 + 1)
    assert program.device.memory_stats()["active_bytes.all.current"] > 0


def test_programs_needing_the_per_call_work_have_no_direct_replay():
    """Resident inputs updated in host memory (an optimizer step): not direct."""
    assert direct_possible(scaled_program(make_device()))
    assert not direct_possible(momentum_program(make_device()))

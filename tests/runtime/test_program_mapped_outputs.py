"""Host-mapped outputs at the runtime level: which outputs the compile-time decision
(:func:`place_mapped_outputs`) lets their kernel write in the caller's memory, the
workspace plan without them, the per-call binding to each call's new output arrays, the
DMA accounting (a mapped d2h write, nothing copied), replayed calls equal to general ones,
and a bad array refused with the device left usable. Programs are built by hand from
numpy kernels; results are compared with numpy."""
from __future__ import annotations

import numpy as np
import pytest

import simaccel.runtime.program as program_module
from simaccel.errors import SimAccelError
from simaccel.runtime.hostmap import place_mapped_inputs, place_mapped_outputs
from simaccel.runtime.program import Program
from simaccel.runtime.replay import Replay
from simaccel.runtime.spec import (BufferDecl, HostStep, InputPlan, LaunchStep, OutputDecl,
                                   Placement, ProgramSpec)
from tests.runtime.test_program_host_mapped import (MIN_BYTES, N, add_one,
                                                    aligned_array as aligned, make_device)


def double(t: np.ndarray, x: np.ndarray) -> None:
    t[:] = x * 2.0


def steps(extra: tuple = ()) -> list:
    """x -> t (doubled) -> y (plus one): y's one writer is the second kernel."""
    return [LaunchStep("double", double, ("t", "x"), (), N, 8 * N, frozenset({"x"}),
                       frozenset({"t"})),
            LaunchStep("add_one", add_one, ("y", "t"), (), N, 8 * N, frozenset({"t"}),
                       frozenset({"y"})), *extra]


def make_spec(program_steps: list, outputs: tuple[OutputDecl, ...] | None = None,
              min_bytes: int = MIN_BYTES, contiguous_host: bool = True,
              library: tuple[str, ...] = (), map_input: bool = False) -> ProgramSpec:
    """A spec whose output ``y`` is placed as the compile-time decision places it (and,
    ``map_input``, its input ``x`` too)."""
    buffers = {name: BufferDecl(name, "float32", N, "input" if name == "x" else "temp")
               for name in ("x", "t", "y", "z")}
    outs = outputs or (OutputDecl("y", (N,), (1,), 0, "float32"),)
    inputs = (InputPlan(0, "x", Placement.COPIED, "float32", True, True),)
    if map_input:
        inputs = place_mapped_inputs(inputs, program_steps, (), {"x": N * 4}, min_bytes)
    outs = place_mapped_outputs(outs, program_steps, inputs,
                                {n: b.numel for n, b in buffers.items()},
                                {n: 4 for n in buffers}, [contiguous_host] * len(outs),
                                min_bytes, len(outs), library)
    return ProgramSpec("graph", buffers, tuple(program_steps), inputs, {}, outs, alignment=64)


def run(program: Program, x: np.ndarray) -> np.ndarray:
    out = np.zeros(N, np.float32)  # a new output array every call, as CompiledGraph makes
    program.run([x], [out])
    return out


def test_a_large_output_is_written_in_place_and_never_copied():
    device = make_device()
    program = Program(device, make_spec(steps()))
    copied = Program(make_device(0), make_spec(steps(), min_bytes=0))
    assert program.spec.outputs[0].mapped and not copied.spec.outputs[0].mapped
    assert "y" not in program.plan.offsets and "y" in copied.plan.offsets
    for k in range(4):
        x = aligned(np.arange(N, dtype=np.float32) + k)
        np.testing.assert_array_equal(run(program, x), x * 2.0 + 1.0)
        np.testing.assert_array_equal(run(copied, x), x * 2.0 + 1.0)
    st = device.dma_stats()
    assert (st["d2h.mapped_writes"], st["d2h.mapped_bytes"]) == (4, 4 * N * 4)
    assert st["d2h.bytes"] == copied.device.dma_stats()["d2h.bytes"]  # bus bytes alike
    assert copied.device.dma_stats()["d2h.mapped_bytes"] == 0
    stats = device.runtime_stats()
    assert stats["replayed_calls"] == 3 and stats["kernel_launches"] == 8


def test_each_call_binds_the_output_kernel_and_an_input_kernel_only_when_it_moved(
        monkeypatch):
    """The kernel writing the mapped output is bound to every call's new output array;
    the one reading the mapped input stays bound while the input's address stays (a new
    view of the same memory included) and is bound again when it moves."""
    program = Program(make_device(), make_spec(steps(), map_input=True))
    assert program.spec.inputs[0].placement is Placement.MAPPED
    assert program.spec.outputs[0].mapped
    binds = []
    real_bind = program_module.bind_launch
    monkeypatch.setattr(program_module, "bind_launch",
                        lambda fn, *rest: binds.append(fn.__name__) or real_bind(fn, *rest))
    x = aligned(np.arange(N, dtype=np.float32))
    for view in (x, x, x.view(), x.reshape(32, 32)):
        np.testing.assert_array_equal(run(program, view).reshape(-1), x * 2.0 + 1.0)
    assert binds == ["double"] + ["add_one"] * 4
    moved = aligned(np.arange(N, dtype=np.float32) - 5.0)
    np.testing.assert_array_equal(run(program, moved), moved * 2.0 + 1.0)
    np.testing.assert_array_equal(run(program, x), x * 2.0 + 1.0)
    assert binds[5:] == ["double", "add_one", "double", "add_one"]
    assert program.device.dma_stats()["h2d.mapped_bytes"] == 6 * N * 4
    assert program.device.dma_stats()["d2h.mapped_bytes"] == 6 * N * 4


def test_replayed_calls_equal_general_calls():
    """Results, DMA counters and timeline spans of replayed calls equal those of calls
    that always take the general way."""
    replayed, general = Program(make_device(), make_spec(steps())), \
        Program(make_device(), make_spec(steps()))
    for k in range(5):
        x = aligned(np.arange(N, dtype=np.float32) * k)
        np.testing.assert_array_equal(run(replayed, x), run(general, x))
        general._bound[()].replay = False  # never replay
    assert isinstance(replayed._bound[()].replay, Replay)
    assert replayed.device.dma_stats() == general.device.dma_stats()
    spans = [[(e.name, e.tid, e.start_ns, e.dur_ns) for e in d.dma.trace_events()]
             for d in (replayed.device, general.device)]
    assert spans[0] == spans[1]


def test_an_output_left_out_is_computed_into_scratch():
    program = Program(make_device(), make_spec(steps()))
    x = aligned(np.arange(N, dtype=np.float32))
    program.run([x], [None])
    np.testing.assert_array_equal(run(program, x), x * 2.0 + 1.0)


@pytest.mark.parametrize("bad", ["strided", "read_only", "dtype"])
def test_a_bad_output_array_is_refused_and_the_next_call_works(bad):
    device = make_device()
    program = Program(device, make_spec(steps()))
    x = aligned(np.arange(N, dtype=np.float32))
    run(program, x)
    out = {"strided": np.zeros(2 * N, np.float32)[::2], "dtype": np.zeros(N, np.float64),
           "read_only": np.zeros(N, np.float32)}[bad]
    out.flags.writeable = bad != "read_only"
    with pytest.raises(SimAccelError, match=r"output 0 \(y\) is host-mapped"):
        program.run([x], [out])
    in_use = device.memory_stats()["allocated_bytes.all.current"]
    np.testing.assert_array_equal(run(program, x), x * 2.0 + 1.0)
    assert device.memory_stats()["allocated_bytes.all.current"] == in_use


@pytest.mark.parametrize("case", ["small", "read_after", "two_writers", "host_step_writes",
                                  "strided_view", "offset_view", "host_not_contiguous",
                                  "library", "twice_an_output"])
def test_outputs_that_are_copied_back_as_before(case):
    program_steps, outs, min_bytes = steps(), None, MIN_BYTES
    contiguous, library = True, ()
    whole = OutputDecl("y", (N,), (1,), 0, "float32")
    if case == "small":
        min_bytes = N * 4 + 1
    elif case == "read_after":  # a later kernel reads it: it must be in device memory
        program_steps = steps((LaunchStep("again", add_one, ("z", "y"), (), N, 8 * N,
                                          frozenset({"y"}), frozenset({"z"})),))
    elif case == "two_writers":
        program_steps = steps((LaunchStep("again", double, ("y", "x"), (), N, 8 * N,
                                          frozenset({"x"}), frozenset({"y"})),))
    elif case == "host_step_writes":
        program_steps = [program_steps[0],
                         HostStep("host", lambda h, sizes: add_one(h["y"], h["t"]), ("t",),
                                  ("y",))]
    elif case == "strided_view":
        outs = (OutputDecl("y", (N // 2,), (2,), 0, "float32"),)
    elif case == "offset_view":
        outs = (OutputDecl("y", (N - 1,), (1,), 1, "float32"),)
    elif case == "host_not_contiguous":
        contiguous = False
    elif case == "library":
        library = ("y",)
    else:
        outs = (whole, whole)
    spec = make_spec(program_steps, outs, min_bytes, contiguous, library)
    assert not any(o.mapped for o in spec.outputs)
    program = Program(make_device(), spec)
    assert "y" in program.plan.offsets

"""Every kernel IR step declares exactly the buffers it reads and writes."""
from __future__ import annotations

import pytest
import torch

from simaccel.codegen.graph import GraphLowering
from simaccel.codegen.hostop import HostOp
from simaccel.codegen.ir import ExternKernel, LibraryKernel, PointwiseKernel, ReductionKernel


def test_a_step_must_declare_what_it_writes():
    """Kernel IR refuses a template or library call that does not say which buffers it
    writes: fusion, planning and host mapping rely on exact sets."""
    with pytest.raises(ValueError, match="must declare the buffers it writes"):
        ExternKernel("t", "src", ["a", "b"], [], 1, 1, frozenset())
    with pytest.raises(ValueError, match="must declare the buffers it writes"):
        LibraryKernel("g", print, ["a", "b"], [], 1, 1, frozenset({"c"}))
    kernel = ExternKernel("t", "src", ["out", "x", "scratch"], [], 1, 1,
                          frozenset({"out", "scratch"}))
    assert kernel.reads == {"x"} and kernel.writes == {"out", "scratch"}


def test_lowered_steps_declare_reads_and_writes():
    """A graph with a fused pointwise chain, a sibling-fused reduction, a GEMM and a host
    op: each step's writes are its outputs, its reads are the buffers it loads."""
    def fn(x, w):
        y = torch.relu(x) * 2
        return y.sum(-1), y.amax(-1), y @ w, torch.linalg.inv(x[:, :4] + 4 * torch.eye(4))

    gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(torch.randn(4, 8), torch.randn(8, 3))
    lowered = GraphLowering(gm).run([torch.randn(4, 8), torch.randn(8, 3)])
    kinds = {type(step) for step in lowered.steps}
    assert {ReductionKernel, LibraryKernel, HostOp} <= kinds, kinds
    x, w = (spec.buffer for spec in lowered.inputs)
    written: set[str] = set()
    for step in lowered.steps:
        assert step.writes and not step.writes & {x, w}
        assert step.reads <= {x, w} | written, (step.name, step.reads)
        assert step.on_device is not isinstance(step, HostOp)
        written |= step.writes
    reduction = next(s for s in lowered.steps if isinstance(s, ReductionKernel))
    assert len(reduction.writes) == 2  # sum and amax in one pass: two outputs
    assert not any(isinstance(s, PointwiseKernel) and x in s.writes for s in lowered.steps)

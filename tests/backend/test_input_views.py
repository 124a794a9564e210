"""Outputs that are views of inputs are made on the host, as eager makes them
(:mod:`simaccel.codegen.input_views`): no kernel copies the input and no transfer brings
the copy back. Values equal eager; the DMA counters show what did not move."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import simaccel
from simaccel.codegen.input_views import input_view_outputs
from tests.conftest import check


def test_training_forward_saves_the_transposed_weight_without_a_copy():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 256))
    x = torch.randn(4, 64)
    expected = torch.autograd.grad(model(x).square().sum(), list(model.parameters()))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="simaccel")
    compiled(x)  # compile
    device = simaccel.get_device()
    device.reset_stats()
    out = compiled(x)
    forward_d2h = device.dma_stats()["d2h.bytes"]
    got = torch.autograd.grad(out.square().sum(), list(model.parameters()))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    # the output and the saved activations (4 x 512, three of them, and 4 x 256) come
    # back; t(weight) of the second layer (256 x 512 float32, 512 KB) does not
    assert forward_d2h <= (3 * 4 * 512 + 4 * 256) * 4
    assert device.runtime_stats()["host_fallback_ops"] == 0


def test_an_inference_graph_returns_views_of_its_input():
    x = torch.randn(32, 48)

    def fn(x):
        return x.t(), x.unsqueeze(0)[:, 4:20], x.sin()
    check(fn, x)  # values, dtypes and shapes equal eager's
    torch._dynamo.reset()
    device = simaccel.get_device()
    compiled = torch.compile(fn, backend="simaccel", dynamic=False)
    compiled(x)
    device.reset_stats()
    t, sliced, _ = compiled(x)
    assert device.dma_stats()["d2h.bytes"] == x.numel() * 4  # only sin(x) comes back
    assert t.data_ptr() == x.data_ptr() and sliced.data_ptr() == x[4:].data_ptr()
    assert t.stride() == x.t().stride() and sliced.shape == (1, 16, 48)


def test_a_view_of_an_input_the_graph_mutates_is_not_replayed():
    def fn(x):
        x.mul_(2.0)
        return x.t() + 0.0, x.t()
    x = torch.randn(8, 6)
    check(fn, x)


def test_views_over_size_symbols_are_not_replayed():
    gm = torch.fx.symbolic_trace(lambda x: x.view(-1))
    # traced without metadata: no tensor value on the placeholder, nothing is replayed
    assert input_view_outputs(gm) == {}


def test_a_saved_input_is_no_device_output():
    """A training forward saves its input ``x`` itself (for the weight gradient): the
    graph returns it as it is, so the program has no output for it (nothing copied back)
    and its steady call replays."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU())
    x = torch.randn(32, 64)
    expected = torch.autograd.grad(model(x).sum(), list(model.parameters()))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="simaccel")
    compiled(x).sum().backward()
    device = simaccel.get_device()
    device.reset_stats()
    for _ in range(3):
        out = compiled(x)
    forward_d2h = device.dma_stats()["d2h.bytes"]
    calls = device.runtime_stats()
    got = torch.autograd.grad(out.sum(), list(model.parameters()))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    name = [r.graph for r in simaccel.reports() if r.graph.endswith("_forward")][-1]
    forward = next(p for p in device.programs() if p.spec.name == name)
    x_buffer = forward.spec.inputs[-1].buffer
    outputs = [o for o in forward.spec.outputs if o is not None]
    assert x_buffer not in {o.buffer for o in outputs}
    # what comes back is the declared outputs (the result, what else the backward saves)
    declared = sum(int(np.prod(o.shape)) * np.dtype(o.dtype).itemsize for o in outputs)
    assert forward_d2h == 3 * declared
    assert calls["replayed_calls"] >= 2 and calls["host_fallback_ops"] == 0

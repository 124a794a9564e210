"""Steady calls by data address end to end (simaccel.address_call,
simaccel.runtime.address): a compiled optimizer step, whose kernels read and update every
tensor in host memory, is called with its tensors' data addresses once its binding
recorded a replay; the launches are patched where a tensor moved (new gradients every
step). Every step is compared with eager's optimizer; the counters prove the device path
ran and that such a call moves, launches and counts what the general replay does."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

import simaccel
import simaccel.compiled
from simaccel.address_call import AddressCall

#: the same fused update as eager's per-parameter ops, in the same order
TOL = {"rtol": 1e-6, "atol": 1e-7}


@pytest.fixture
def address_calls(monkeypatch) -> list[int]:
    """Counts the calls made by data address (one entry per call)."""
    calls: list[int] = []
    original = AddressCall.__call__

    def counted(self: AddressCall, args: list[Any]) -> list[Any] | None:
        outputs = original(self, args)
        if outputs is not None:
            calls.append(1)
        return outputs
    monkeypatch.setattr(AddressCall, "__call__", counted)
    return calls


def train_steps(steps: int, grads: str, seed: int = 0) -> dict:
    """``steps`` SGD-momentum steps of a compiled ``opt.step`` with a LambdaLR schedule
    (the learning rate a lifted scalar changing every step), each compared with eager's
    optimizer on the same gradients; the device counters after."""
    torch._dynamo.reset()
    counters.clear()
    device = simaccel.get_device()
    device.reset_stats()
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(*shape, generator=gen))
              for shape in ((32, 16), (32,), (8, 32))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opts = [torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=False) for ps in (params, ref)]
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1.0 / (1 + k)) for o in opts]
    step = torch.compile(opts[0].step, backend="simaccel")
    for k in range(steps):
        for p, r in zip(params, ref):
            g = torch.randn(p.shape, generator=gen)
            if grads == "new" or p.grad is None:
                p.grad = g
            else:
                p.grad.copy_(g)  # the same tensors, written in place (accumulated)
            r.grad = g.clone()
        step()
        opts[1].step()
        for schedule in schedules:
            schedule.step()
        for p, r in zip(params, ref):
            torch.testing.assert_close(p, r, **TOL)
        if grads == "new":
            opts[0].zero_grad(set_to_none=True)
    return {**device.runtime_stats(), **device.dma_stats(),
            "graphs": counters["stats"]["unique_graphs"]}


@pytest.mark.parametrize("grads", ["new", "in_place"])
def test_optimizer_steps_call_by_address_and_count_what_general_replays_count(
        grads, address_calls, monkeypatch):
    steps = 10
    by_address = train_steps(steps, grads)
    made = len(address_calls)
    # the first step makes the momentum buffers (a graph of its own); the second
    # compiles the steady graph and records its replay; every later one calls by address
    assert made == steps - 2
    monkeypatch.setattr(simaccel.compiled, "address_replay", lambda program, layout: None)
    general = train_steps(steps, grads)
    assert len(address_calls) == made  # none more
    compared = ["calls", "replayed_calls", "kernel_launches", "host_fallback_ops", "graphs",
                *(key for key in by_address if key.startswith(("h2d.", "d2h.", "const.",
                                                               "compute_items"))
                  and not key.endswith("_ns"))]
    for key in compared:
        assert by_address[key] == general[key], key
    assert by_address["kernel_launches"] > 0 and by_address["host_fallback_ops"] == 0


def test_a_tensor_of_another_layout_leaves_the_address_call_before_anything_moves(
        address_calls, monkeypatch):
    """A gradient of other strides at the address call: the call says no and nothing
    moves (what the general path does with it is its own business: here it is called
    directly, past Dynamo's guards, which would have recompiled)."""
    graphs = []
    original = simaccel.compiled.CompiledGraph.__init__

    def kept(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        graphs.append(self)
    monkeypatch.setattr(simaccel.compiled.CompiledGraph, "__init__", kept)
    train_steps(8, "new")
    graph = next(g for g in graphs if g._address_call is not None)
    call = graph._address_call
    args = _step_args(graph)
    device = simaccel.get_device()
    before = {**device.runtime_stats(), **device.dma_stats()}
    moved = [k for k, t in enumerate(args) if isinstance(t, torch.Tensor)
             and t.data_ptr() not in call.replay.addresses]
    assert moved  # fresh gradients: their addresses are new to the launches
    k = moved[0]
    args[k] = args[k].t().contiguous().t()  # same sizes, transposed strides
    assert call(list(args)) is None
    number = next(i for i, a in enumerate(args) if isinstance(a, float))
    args[number] = torch.tensor(args[number])  # a lifted scalar as a 0-d tensor
    assert call(list(args)) is None
    after = {**device.runtime_stats(), **device.dma_stats()}
    assert after == before


def _step_args(graph: Any) -> list[Any]:
    """Arguments of the graph's address call like a step's: the tensors at its kept
    views' positions and new gradients elsewhere, Python floats at the bank's."""
    call = graph._address_call
    args: list[Any] = [0.1] * graph._host_arrays.count
    for index, (dtype, shape, stride) in zip(call.replay.indices, call._layouts):
        args[index] = torch.empty_strided(shape, stride, dtype=dtype).normal_()
    return args


def test_a_reconfigured_device_leaves_the_address_call_and_finds_it_again(address_calls):
    """A new arena and DMA engine mid-training (and a recompile: the config guard): the
    steps go the general way until the new graph's binding recorded its replay, then by
    address again, every step equal to eager's."""
    import dataclasses
    device = simaccel.get_device()
    config = device.config
    torch._dynamo.reset()
    params = [torch.nn.Parameter(torch.randn(16, 8)), torch.nn.Parameter(torch.randn(16))]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opts = [torch.optim.SGD(ps, lr=0.05, momentum=0.9, foreach=False) for ps in (params, ref)]
    step = torch.compile(opts[0].step, backend="simaccel")
    try:
        for k in range(12):
            if k == 6:
                device.reconfigure(dataclasses.replace(config, dma_latency_ns=1000.0))
            for p, r in zip(params, ref):
                p.grad = torch.randn_like(p)
                r.grad = p.grad.clone()
            step()
            opts[1].step()
            for p, r in zip(params, ref):
                torch.testing.assert_close(p, r, **TOL)
    finally:
        device.reconfigure(config)
    # steps 2-5 by address; step 6 recompiles and records, 7-11 by address again
    assert len(address_calls) == 4 + 5


def train_mlp(steps: int) -> dict:
    """``steps`` training steps (forward, cross-entropy, backward, SGD momentum with a
    LambdaLR) of a compiled MLP whose first weight's gradient (512 KB) is written by its
    kernel in host memory (a mapped output), each step's parameters compared with an
    eager copy's; the device counters after."""
    torch._dynamo.reset()
    counters.clear()
    device = simaccel.get_device()
    device.reset_stats()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    ref = copy_of(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, foreach=False)
            for m in (model, ref)]
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1.0 / (1 + k)) for o in opts]
    forward = torch.compile(model, backend="simaccel")
    step = torch.compile(opts[0].step, backend="simaccel")
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 512, generator=gen), torch.randint(0, 10, (16,), generator=gen))
               for _ in range(3)]
    for k in range(steps):
        x, y = batches[k % len(batches)]
        for run, opt, schedule in ((forward, opts[0], schedules[0]),
                                   (ref, opts[1], schedules[1])):
            torch.nn.functional.cross_entropy(run(x), y).backward()
            (step if run is forward else opt.step)()
            opt.zero_grad(set_to_none=True)
            schedule.step()
        for p, r in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)
    return {**device.runtime_stats(), **device.dma_stats(),
            "graphs": counters["stats"]["unique_graphs"]}


def copy_of(model: torch.nn.Module) -> torch.nn.Module:
    import copy
    return copy.deepcopy(model)


def test_a_training_step_calls_forward_backward_and_step_by_address(address_calls,
                                                                    monkeypatch):
    """Forward (copied batch, mapped parameters, saved activations copied out), backward
    (copied activations, a gradient written in host memory), optimizer step: each graph
    by address once its binding recorded a replay, moving, launching and counting what
    the general replays do."""
    steps = 8
    by_address = train_mlp(steps)
    made = len(address_calls)
    # forward and backward from the second step (the first records their replays), the
    # optimizer step's steady graph from the third (the first step's graph is its own)
    assert made == 2 * (steps - 1) + steps - 2
    monkeypatch.setattr(simaccel.compiled, "address_replay", lambda program, layout: None)
    general = train_mlp(steps)
    assert len(address_calls) == made
    compared = ["calls", "replayed_calls", "kernel_launches", "host_fallback_ops", "graphs",
                *(key for key in by_address if key.startswith(("h2d.", "d2h.", "const.",
                                                               "compute_items"))
                  and not key.endswith("_ns"))]
    for key in compared:
        assert by_address[key] == general[key], key
    assert by_address["host_fallback_ops"] == 0 and by_address["d2h.bytes"] > 0


def test_inference_with_resident_weights_calls_by_address_until_a_weight_changes(
        address_calls):
    """Weights kept on the device (inference): calls by address while they are the same
    tensors at the same versions; an in-place update goes the general way, which uploads
    it, and the calls after go by address again, every output equal to eager's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 8)).eval()
    compiled = torch.compile(model, backend="simaccel")
    device = simaccel.get_device()
    device.reset_stats()
    with torch.no_grad():
        for k in range(10):
            if k == 5:
                model[0].weight.mul_(0.5)  # a new version of a resident weight
            x = torch.randn(4, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
            if k == 4:
                uploads = device.runtime_stats()["resident_uploads"]
    assert uploads > 0  # the weights are resident
    assert device.runtime_stats()["resident_uploads"] == uploads + 1  # the changed weight
    # calls 1-4 by address (the first records its replay); call 5 goes the general
    # way, which uploads the weight, and finds a new one; calls 6-9 by address
    assert len(address_calls) == 4 + 4


def test_a_decoder_forward_and_backward_call_by_address_and_equal_eager(address_calls):
    """The bench's GPT-2-style decoder (1 layer): weights read in host memory and on the
    device, a fused attention whose per-head outputs are slices of one projection and
    whose statistics eager lays out heads-inner (copied through views), a 0-d scalar
    input of the bank; outputs and gradients equal eager's."""
    from simaccel.bench.gpt2 import gpt2
    torch._dynamo.reset()
    model, (tokens,) = gpt2(1, 2, 16)
    compiled = torch.compile(model, backend="simaccel")
    gen = torch.Generator().manual_seed(2)
    for k in range(6):
        x = torch.randint(0, model.config.vocab_size, tokens.shape, generator=gen)
        got, want = compiled(x), model(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        if k in (3, 5):
            got.square().mean().backward()
            grads = {name: p.grad.clone() for name, p in model.named_parameters()}
            model.zero_grad()
            want.square().mean().backward()
            for name, p in model.named_parameters():
                torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-5)
            model.zero_grad()
    assert len(address_calls) >= 4


def test_weights_changing_every_call_look_for_an_address_call_ever_more_rarely(
        address_calls, monkeypatch):
    """Resident weights updated before every call (as an optimizer would): no call fits
    an address call, so the graph waits 1, 3, 7, ... general calls before looking for
    the next; every output equal to eager's."""
    looked: list[int] = []
    found = simaccel.compiled.address_replay

    def counted(program: Any, layout: Any) -> Any:
        looked.append(1)
        return found(program, layout)
    monkeypatch.setattr(simaccel.compiled, "address_replay", counted)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()).eval()
    compiled = torch.compile(model, backend="simaccel")
    with torch.no_grad():
        for _ in range(40):
            model[0].weight.add_(0.01)
            x = torch.randn(2, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    assert not address_calls
    # looked for after the calls 1, 2, 4, 8, 16 and 32 that went the general way
    assert len(looked) <= 7


def test_an_address_call_holds_none_of_the_tensors_it_ran_on(address_calls):
    """After a step by address, the gradients it read are freed once the optimizer sets
    them to None: the launches keep none of them alive (the next call points them at
    its own), so their memory comes back for the next gradients."""
    import weakref
    torch._dynamo.reset()
    params = [torch.nn.Parameter(torch.randn(64, 64)) for _ in range(2)]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=False)
    step = torch.compile(opt.step, backend="simaccel")
    for k in range(6):
        for p in params:
            p.grad = torch.randn_like(p)
        grads = [weakref.ref(p.grad) for p in params]
        step()
        opt.zero_grad(set_to_none=True)
        if address_calls:
            assert all(g() is None for g in grads), k
    assert len(address_calls) == 4

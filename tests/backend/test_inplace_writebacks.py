"""Input write-backs computed in place (:mod:`simaccel.codegen.inplace`): with host
mapping off (``host_map_min_bytes=0``; on, such an input is a mapped update instead,
tests/backend/test_mapped_updates.py) a parameter or optimizer state the step updates
stays resident on the device, its kernel storing the new value into the input's own
device copy, so the next step uploads only what changed (the gradients). Every test
compares with eager over several calls, and the cases that could leave a stale device
copy (a host-side update between steps, another compiled graph reading the same
parameters, a failed call) are checked to re-upload."""
from __future__ import annotations

import pytest
import torch

import simaccel
from simaccel.runtime import program as program_module
from simaccel.runtime.replay import Replay

TOL = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(autouse=True)
def resident_updates():
    """The resident path: host mapping off."""
    with simaccel.configure(host_map_min_bytes=0):
        yield


def _pair(optimizer: type, **options):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(8, 8)) for _ in range(4)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, r in zip(params, ref):
        p.grad = torch.randn_like(p)
        r.grad = p.grad.clone()
    return params, ref, optimizer(params, foreach=False, **options), \
        optimizer(ref, foreach=False, **options)


def _same(params, ref) -> None:
    for p, r in zip(params, ref):
        torch.testing.assert_close(p, r, **TOL)


def test_a_step_after_the_first_uploads_only_the_gradients():
    params, ref, opt, ref_opt = _pair(torch.optim.AdamW, lr=0.01)
    torch._dynamo.reset()
    step = torch.compile(opt.step, backend="simaccel")
    device = simaccel.get_device()
    step()
    ref_opt.step()
    device.reset_stats()
    for _ in range(4):
        for p, r in zip(params, ref):  # new gradients, written in place as backward does
            p.grad.normal_()
            r.grad.copy_(p.grad)
        step()
        ref_opt.step()
        _same(params, ref)
    stats = device.runtime_stats()
    grads = sum(p.grad.nbytes for p in params)
    assert stats["resident_uploads"] == 0 and stats["kernel_launches"] > 0
    # the gradients, and the constant bank (lr, the step counters) when it changed
    h2d = device.dma_stats()["h2d.bytes"] / 4
    assert grads <= h2d < grads + 1024


def test_a_parameter_changed_on_the_host_between_steps_is_uploaded_again():
    params, ref, opt, ref_opt = _pair(torch.optim.SGD, lr=0.1, momentum=0.9)
    opt.step()
    ref_opt.step()  # the momentum buffers exist from here
    torch._dynamo.reset()
    step = torch.compile(opt.step, backend="simaccel")
    device = simaccel.get_device()
    for i in range(4):
        if i == 2:
            device.reset_stats()
            with torch.no_grad():
                for p, r in zip(params, ref):
                    p.mul_(0.5)
                    r.mul_(0.5)
        step()
        ref_opt.step()
        _same(params, ref)
    assert device.runtime_stats()["resident_uploads"] == len(params)


def test_a_compiled_forward_reads_the_parameters_the_compiled_step_updated():
    torch.manual_seed(0)
    model, ref = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01, foreach=False)
    torch._dynamo.reset()
    forward = torch.compile(model, backend="simaccel")
    step = torch.compile(opt.step, backend="simaccel")
    x = torch.randn(16, 8)
    for _ in range(4):
        for fwd, o, s in ((forward, opt, step), (ref, ref_opt, ref_opt.step)):
            o.zero_grad()
            fwd(x).square().mean().backward()
            s()
        with torch.no_grad():
            torch.testing.assert_close(forward(x), ref(x), **TOL)
    _same(model.parameters(), ref.parameters())


def test_a_written_input_moves_its_version_as_an_in_place_op_does():
    """A mutation AOTAutograd hides from autograd (a tensor that needs no grad, under
    no_grad) gets its version bump from the graph, so resident copies elsewhere notice."""
    def bump(buf, x):
        buf.add_(x)
        return buf.sum()
    buf, x = torch.zeros(16), torch.ones(16)
    ref = buf.clone()
    torch._dynamo.reset()
    compiled = torch.compile(bump, backend="simaccel")
    with torch.no_grad():
        for _ in range(3):
            before, ref_before = buf._version, ref._version
            compiled(buf, x)
            bump(ref, x)
            assert buf._version - before == ref._version - ref_before == 1
    torch.testing.assert_close(buf, ref)


def test_a_value_read_at_another_element_is_not_computed_in_place():
    """``x.copy_(x.flip(0))`` reads the input at elements it has not stored yet: the new
    value takes a buffer of its own."""
    def flip(x):
        x.copy_(x.flip(0) * 2)
        return x.sum()
    x = torch.arange(8.0)
    ref = x.clone()
    torch._dynamo.reset()
    compiled = torch.compile(flip, backend="simaccel")
    for _ in range(3):
        torch.testing.assert_close(compiled(x), flip(ref))
        torch.testing.assert_close(x, ref)


def test_a_failed_call_forgets_the_device_copies_it_wrote(monkeypatch):
    params, ref, opt, ref_opt = _pair(torch.optim.SGD, lr=0.1)
    torch._dynamo.reset()
    step = torch.compile(opt.step, backend="simaccel")
    step()
    ref_opt.step()
    real = program_module.Program._download, Replay._download

    def broken(self, *args, **kwargs):
        raise RuntimeError("read-back failed")
    # the general call's read-back and a replayed call's (simaccel.runtime.replay)
    monkeypatch.setattr(program_module.Program, "_download", broken)
    monkeypatch.setattr(Replay, "_download", broken)
    with pytest.raises(RuntimeError, match="read-back failed"):
        step()  # the device copies hold a value the parameters never got
    monkeypatch.setattr(program_module.Program, "_download", real[0])
    monkeypatch.setattr(Replay, "_download", real[1])
    device = simaccel.get_device()
    device.reset_stats()
    step()
    ref_opt.step()
    _same(params, ref)
    assert device.runtime_stats()["resident_uploads"] == len(params)

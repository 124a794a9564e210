"""Mapped updates end to end: a compiled optimizer step reads and writes each parameter
and state tensor in the caller's memory (``Placement.MAPPED_UPDATE``), copies only the
gradients in, and copies nothing back; the accesses are counted as h2d reads and d2h
writes. Every test compares the parameters with an eager optimizer after every step and
checks the device ran the update."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import simaccel

#: parameters after each step against eager's (fp32, the same update in a fused kernel)
TOL = {"rtol": 1e-5, "atol": 1e-6}
STEPS = 4


def _pair(optimizer: type, params: list[torch.Tensor], **options):
    """``optimizer`` on ``params`` and on copies of them, with equal gradients."""
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, r in zip(params, ref):
        p.grad = torch.randn_like(p)
        r.grad = p.grad.clone()
    return ref, optimizer(params, foreach=False, **options), \
        optimizer(ref, foreach=False, **options)


def _params(count: int = 3) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(16, 8)) for _ in range(count)]


def _steps(params, ref, opt, ref_opt, between=None) -> dict[str, float]:
    """One eager first step (it makes the state), then :data:`STEPS` compiled steps
    checked against eager; returns the DMA stats of the compiled steps."""
    opt.step()
    ref_opt.step()
    torch._dynamo.reset()
    step = torch.compile(opt.step, backend="simaccel")
    device = simaccel.get_device()
    device.reset_stats()
    for k in range(STEPS):
        if between is not None:
            between(k)
        step()
        ref_opt.step()
        for p, r in zip(params, ref):
            torch.testing.assert_close(p, r, **TOL)
    stats = device.runtime_stats()
    assert stats["kernel_launches"] >= STEPS and stats["host_fallback_ops"] == 0
    assert stats["resident_uploads"] == 0  # nothing kept on the device to refresh
    assert counters["stats"]["unique_graphs"] == 1
    return device.dma_stats()


@pytest.mark.parametrize("optimizer, options, state_per_param, counter_bytes", [
    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, 1, 0),
    # exp_avg, exp_avg_sq; the 0-d float32 step count: read by value from the constant
    # bank, its new value copied back
    (torch.optim.AdamW, {"lr": 0.01}, 2, 4),
])
def test_an_optimizer_step_updates_parameters_and_state_in_host_memory(
        optimizer, options, state_per_param, counter_bytes):
    params = _params()
    ref, opt, ref_opt = _pair(optimizer, params, **options)
    dma = _steps(params, ref, opt, ref_opt)
    report = simaccel.reports()[-1]
    updated = len(params) * (1 + state_per_param)
    # the gradients too: each is read by the kernel updating its parameter, which runs
    # across the bus anyway, so it is read there rather than copied first
    read = len(params)
    assert len(report.host_mapped) == updated + read
    nbytes = params[0].nbytes  # every parameter, gradient and state tensor has its size
    assert dma["d2h.mapped_writes"] == STEPS * updated
    counters_bytes = STEPS * len(params) * counter_bytes
    assert dma["d2h.mapped_bytes"] == STEPS * updated * nbytes
    assert dma["d2h.bytes"] == dma["d2h.mapped_bytes"] + counters_bytes
    assert dma["h2d.mapped_bytes"] == STEPS * (updated + read) * nbytes
    assert dma["h2d.bytes"] == dma["h2d.mapped_bytes"]  # nothing copied per step


def test_a_parameter_changed_on_the_host_between_steps_is_read_as_it_is():
    params = _params()
    ref, opt, ref_opt = _pair(torch.optim.SGD, params, lr=0.1, momentum=0.9)

    def halve(k: int) -> None:
        if k == 2:
            with torch.no_grad():
                for p, r in zip(params, ref):
                    p.mul_(0.5)
                    r.mul_(0.5)
    _steps(params, ref, opt, ref_opt, between=halve)


def test_a_misaligned_parameter_is_updated_in_place():
    """A parameter viewing a flat buffer 4 bytes past an aligned address: the kernel
    addresses its elements itself, so nothing is staged."""
    torch.manual_seed(0)
    flat = torch.randn(3 * 128 + 1)
    params = [torch.nn.Parameter(flat[1 + 128 * k:1 + 128 * (k + 1)].view(16, 8))
              for k in range(3)]
    assert all(p.data_ptr() % 64 for p in params)
    ref, opt, ref_opt = _pair(torch.optim.SGD, params, lr=0.1, momentum=0.9)
    dma = _steps(params, ref, opt, ref_opt)
    assert dma["d2h.mapped_writes"] == STEPS * 3 * 2


def test_new_gradient_tensors_each_step_are_read_where_they_are():
    """``zero_grad(set_to_none=True)`` and a backward give every step new gradient tensors
    (new host arrays, often new addresses): the kernels reading them in host memory are
    bound to each step's, and the parameters equal eager's after every step."""
    params = _params()
    ref, opt, ref_opt = _pair(torch.optim.SGD, params, lr=0.1, momentum=0.9)
    keep = []  # old gradients stay alive, so the new ones get new addresses

    def new_grads(k: int) -> None:
        for p, r in zip(params, ref):
            keep.append(p.grad)
            p.grad = torch.randn_like(p)
            r.grad = p.grad.clone()
    dma = _steps(params, ref, opt, ref_opt, between=new_grads)
    mapped = {index for index, _, _ in simaccel.reports()[-1].host_mapped}
    assert len(mapped) == 3 * len(params)  # parameters, momentum buffers and gradients
    assert dma["h2d.bytes"] == dma["h2d.mapped_bytes"]

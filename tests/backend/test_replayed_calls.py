"""Replayed calls end to end (simaccel.runtime.replay): after a compiled graph's first
call, its later calls replay the recorded one. Every call is compared with eager, and the
counters prove the device path ran: one replay per call after the first, kernels
launched, the inputs' bytes moved, nothing on the host, no recompile."""
from __future__ import annotations

import torch
from torch._dynamo.utils import counters

import simaccel

#: fp32 pointwise ops in one fused kernel against eager's: the same ops in the same order
TOL = {"rtol": 1e-6, "atol": 1e-6}


def test_a_compiled_function_replays_its_call_with_new_inputs_and_scalars():
    def scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.relu(x * scale + 1.0)

    compiled = torch.compile(scaled, backend="simaccel")
    device = simaccel.get_device()
    calls = 6
    for k in range(calls):
        x = torch.randn(32, 8)
        scale = 0.5 + k  # a lifted float: a new value every call, no recompile
        out = compiled(x, scale)
        torch.testing.assert_close(out, scaled(x, scale), **TOL)
        assert out.shape == (32, 8) and out.dtype == torch.float32
    stats, dma = device.runtime_stats(), device.dma_stats()
    assert stats["calls"] == calls and stats["replayed_calls"] == calls - 1
    assert stats["kernel_launches"] >= calls and stats["host_fallback_ops"] == 0
    assert dma["h2d.bytes"] >= calls * 32 * 8 * 4 and dma["d2h.bytes"] >= calls * 32 * 8 * 4
    assert counters["stats"]["unique_graphs"] == 1


def test_a_compiled_sgd_momentum_step_with_a_scheduler_replays_every_step():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(16, 16)) for _ in range(4)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9, foreach=False)
    ref_opt = torch.optim.SGD(ref, lr=0.05, momentum=0.9, foreach=False)
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s))
                  for o in (opt, ref_opt)]
    for p, r in zip(params, ref):
        p.grad = torch.randn_like(p)
        r.grad = p.grad.clone()
    opt.step()  # the eager first step makes the momentum buffers
    ref_opt.step()
    step = torch.compile(opt.step, backend="simaccel")
    device = simaccel.get_device()
    steps = 12
    for _ in range(steps):
        for p, r in zip(params, ref):  # new gradients every step, as in training
            p.grad.copy_(torch.randn_like(p))
            r.grad.copy_(p.grad)
        step()
        ref_opt.step()
        for scheduler in schedulers:
            scheduler.step()
        for p, r in zip(params, ref):
            torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)
    stats = device.runtime_stats()
    assert stats["calls"] == steps and stats["replayed_calls"] == steps - 1
    assert stats["host_fallback_ops"] == 0
    assert device.dma_stats()["h2d.bytes"] >= steps * sum(p.grad.nbytes for p in params)
    assert counters["stats"]["unique_graphs"] == 1


def test_a_growing_kv_cache_records_no_replay_it_would_never_repeat():
    """A decode step whose cache grows by one row (``torch.cat``) binds a new size tuple
    every call: a program with size symbols records a binding's replay at its second
    call, so the growth records none; a size seen again replays from its third call."""
    from tests.models.kv_decoder import CachedAttention

    torch.manual_seed(0)
    layer = CachedAttention().eval()
    compiled = torch.compile(layer.grow, backend="simaccel", dynamic=True)
    device = simaccel.get_device()
    x = torch.randn(1, 1, 32)
    # 2 rows (Dynamo specializes a size of 1); two tensors (one would be a guard on k is v)
    k, v = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)
    with torch.no_grad():
        for _ in range(8):
            out, k_next, v_next = compiled(x, k, v)
            for got, want in zip((out, k_next, v_next), layer.grow(x, k, v)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            k, v = k_next, v_next
        grown = device.runtime_stats()
        assert grown["calls"] == 8 and grown["replayed_calls"] == 0
        assert grown["kernel_launches"] >= 8 and grown["host_fallback_ops"] == 0
        for _ in range(3):  # the same size again: general, recorded, replayed
            out, _, _ = compiled(x, k, v)
            torch.testing.assert_close(out, layer.grow(x, k, v)[0], rtol=1e-5, atol=1e-6)
    stats = device.runtime_stats()
    assert stats["calls"] == 11 and stats["replayed_calls"] == 1
    assert counters["stats"]["unique_graphs"] == 1


def test_a_new_binding_replays_though_no_scalar_changed():
    """A kernel switching tiers (a background compile loaded) makes every program bind
    anew. A lifted scalar that keeps its value moves no constant-bank upload on the new
    binding; its calls must still replay (they went the general way every call)."""
    from simaccel.runtime import tiers

    def scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.relu(x * scale + 1.0)

    compiled = torch.compile(scaled, backend="simaccel")
    device = simaccel.get_device()
    x = torch.randn(32, 8)
    for k in range(6):
        if k == 2:
            tiers.bump()  # as a kernel's compiled form arriving does
        out = compiled(x, 0.5)
        torch.testing.assert_close(out, scaled(x, 0.5), **TOL)
    stats = device.runtime_stats()
    assert stats["calls"] == 6 and stats["replayed_calls"] == 4  # calls 1 and 3 general
    assert counters["stats"]["unique_graphs"] == 1


def _recorded_lists(program) -> list[int]:
    """Per command list a replayed binding of ``program`` runs, how many launches it
    covers (:mod:`simaccel.runtime.sequence`)."""
    counts = []
    for bound in program._bound.values():
        steps = bound.sequence.steps if bound.sequence is not None else None
        counts += [n for call, n, owners in steps or () if owners is not None]
        assert steps is None or sum(n for _, n, _ in steps) == len(bound.launches)
    return counts


def test_a_replayed_forward_runs_its_launches_as_command_lists():
    """An MLP forward (bias GEMMs, ReLU): once its replay ran its kernels a few times,
    they run as native command lists; every call still equals eager."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 16)).eval()
    compiled = torch.compile(model, backend="simaccel")
    device = simaccel.get_device()
    earlier = set(device.programs())  # other tests' programs, still alive
    with torch.no_grad():
        compiled(torch.randn(8, 32))
        simaccel.wait_for_kernels()  # the kernels' compiled forms, which lists call
        for _ in range(8):
            x = torch.randn(8, 32)
            out = compiled(x)
            torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
            assert out.shape == (8, 16) and out.dtype == torch.float32
    lists = [n for p in device.programs() if p not in earlier for n in _recorded_lists(p)]
    assert lists and max(lists) >= 3  # the GEMMs and ReLUs of one forward, in one list
    stats = device.runtime_stats()
    assert stats["replayed_calls"] >= 6 and stats["host_fallback_ops"] == 0
    assert stats["kernel_launches"] >= 9 * 5
    assert device.dma_stats()["h2d.bytes"] >= 9 * 8 * 32 * 4
    assert counters["stats"]["unique_graphs"] == 1


def test_a_training_step_with_command_lists_trains_as_eager():
    """Forward, backward and an SGD-momentum step (a LambdaLR changing the lr) compiled:
    the backward's weight gradients are new host-mapped arrays every step, patched into
    the recorded lists; the parameters follow eager's step after step."""
    torch.manual_seed(0)

    def mlp() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                   torch.nn.Linear(64, 10))
    models = [mlp(), mlp()]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, foreach=False)
            for m in models]
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s)) for o in opts]
    forward = torch.compile(models[0], backend="simaccel")
    step = torch.compile(opts[0].step, backend="simaccel")
    device = simaccel.get_device()
    earlier = set(device.programs())  # other tests' programs, still alive
    for k in range(10):
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        for f, s, opt, scheduler in ((forward, step, opts[0], schedulers[0]),
                                     (models[1], opts[1].step, opts[1], schedulers[1])):
            torch.nn.functional.cross_entropy(f(x), y).backward()
            s()
            opt.zero_grad(set_to_none=True)
            scheduler.step()
        if k == 0:
            simaccel.wait_for_kernels()
        for p, r in zip(models[0].parameters(), models[1].parameters()):
            torch.testing.assert_close(p, r, rtol=1e-4, atol=1e-5)
    assert sum(len(_recorded_lists(p)) for p in device.programs() if p not in earlier) >= 2
    stats = device.runtime_stats()
    assert stats["host_fallback_ops"] == 0 and stats["replayed_calls"] >= 20
    assert device.dma_stats()["d2h.bytes"] > 0

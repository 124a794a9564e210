"""The device model seen through compiled models: constant bank, resident parameters,
memory back to baseline, out-of-memory, threads."""
from __future__ import annotations

import gc
import threading

import pytest
import torch

import simaccel
from simaccel.errors import DeviceOutOfMemoryError, InvalidOptionError

TEMPERATURE = 1.0


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                       torch.nn.Linear(64, 16))

    def forward(self, x):
        return torch.softmax(self.net(x) / TEMPERATURE, dim=-1)


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    gc.collect()
    yield
    torch._dynamo.reset()
    gc.collect()


def test_constant_bank_transfers_only_when_a_lifted_value_changes():
    global TEMPERATURE
    torch.manual_seed(0)
    model, x = Head().eval(), torch.randn(4, 32)
    device = simaccel.get_device()
    gc.collect()
    baseline = device.memory_stats()["allocated_bytes.all.current"]
    device.reset_stats()
    compiled = torch.compile(model, backend="simaccel", dynamic=False)
    changes = 0
    with torch.no_grad():
        for call in range(100):
            if call % 10 in (1, 4, 7):  # 30 of the 100 calls see a new temperature
                TEMPERATURE = 0.5 + call / 100
                changes += 1
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    dma, rt = device.dma_stats(), device.runtime_stats()
    assert changes == 30
    assert dma["const.transfers"] == changes + 1  # plus the first call
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert rt["resident_bytes"] == weight_bytes  # weights uploaded exactly once
    assert rt["graphs_compiled"] == 1
    del compiled
    torch._dynamo.reset()
    gc.collect()
    assert device.memory_stats()["allocated_bytes.all.current"] == baseline


def test_inplace_parameter_update_is_re_uploaded():
    model, x = Head().eval(), torch.randn(2, 32)
    compiled = torch.compile(model, backend="simaccel")
    device = simaccel.get_device()
    with torch.no_grad():
        compiled(x)
        device.reset_stats()
        model.net[0].weight.mul_(0.5)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    assert device.runtime_stats()["resident_uploads"] == 1


def test_static_address_input_stays_on_the_device_until_it_changes():
    """torch._dynamo.mark_static_address: uploaded once, again only after an in-place
    update (its version counter moves); a plain input is copied in on every call."""
    table, x = torch.randn(512, 64), torch.randn(512, 64)
    torch._dynamo.mark_static_address(table)
    compiled = torch.compile(lambda t, y: (t * y).sum(-1), backend="simaccel", dynamic=False)
    device = simaccel.get_device()
    compiled(table, x)
    device.reset_stats()
    for _ in range(5):
        torch.testing.assert_close(compiled(table, x), (table * x).sum(-1),
                                   rtol=1e-4, atol=1e-5)
    rt, dma = device.runtime_stats(), device.dma_stats()
    assert rt["resident_uploads"] == 0 and rt["kernel_launches"] >= 5
    assert dma["h2d.bytes"] == 5 * x.numel() * 4  # only the plain input moves
    table.mul_(-2.0)  # in place: the device copy is stale now
    torch.testing.assert_close(compiled(table, x), (table * x).sum(-1), rtol=1e-4, atol=1e-5)
    assert device.runtime_stats()["resident_uploads"] == 1
    assert device.runtime_stats()["resident_bytes"] == table.numel() * 4
    assert device.runtime_stats()["host_fallback_ops"] == 0


def test_misaligned_parameter_is_staged_at_upload_without_a_per_call_guard():
    weight = torch.nn.Parameter(torch.randn(1025)[1:])  # 4 bytes past an aligned block
    assert weight.data_ptr() % simaccel.get_device().config.alignment != 0
    x = torch.randn(1024)
    compiled = torch.compile(lambda t: (t * weight).sum(), backend="simaccel", dynamic=False)
    device = simaccel.get_device()
    device.reset_stats()
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), (x * weight).sum(), rtol=1e-4, atol=1e-4)
    assert device.dma_stats()["staged.bytes"] == weight.numel() * 4  # one staged upload
    assert device.runtime_stats()["resident_uploads"] == 1
    aligned_guards = [g.source for g in simaccel.reports()[-1].guards.added
                      if g.name == "simaccel.aligned"]
    assert aligned_guards == ["L['t']"]


def test_device_too_small_raises_oom_with_figures_and_recovers():
    model, x = Head().eval(), torch.randn(256, 32)
    device = simaccel.get_device()
    ooms = device.memory_stats()["num_ooms"]
    with simaccel.configure(memory_bytes=16 << 10):
        with pytest.raises(DeviceOutOfMemoryError) as info:
            with torch.no_grad():
                torch.compile(model, backend="simaccel")(x)
        err = info.value
        assert err.requested_bytes > err.largest_free_block
        assert err.capacity_bytes == 16 << 10
        assert "bytes" in str(err) and "configure" in str(err)
        assert device.memory_stats()["num_ooms"] == ooms + 1
        torch._dynamo.reset()
        small = torch.compile(lambda t: t * 2 + 1, backend="simaccel")
        torch.testing.assert_close(small(torch.ones(8)), torch.full((8,), 3.0))
    torch._dynamo.reset()
    with torch.no_grad():  # the default device is back and works
        torch.testing.assert_close(torch.compile(model, backend="simaccel")(x), model(x),
                                   rtol=1e-5, atol=1e-6)


def test_eight_threads_fifty_calls_each_equal_eager():
    torch.manual_seed(0)
    model = Head().eval()
    compiled = torch.compile(model, backend="simaccel")
    inputs = [torch.randn(3, 32) for _ in range(8)]
    with torch.no_grad():
        compiled(inputs[0])
        expected = [model(x) for x in inputs]
    failures: list[str] = []

    def worker(k: int) -> None:
        with torch.no_grad():
            for _ in range(50):
                got = compiled(inputs[k])
                if not torch.allclose(got, expected[k], rtol=1e-5, atol=1e-6):
                    failures.append(f"thread {k}")
                    return

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_configure_rejects_nonsense_and_restores():
    before = simaccel.get_device().config
    with pytest.raises(InvalidOptionError, match="alignment"):
        simaccel.configure(alignment=3)
    with pytest.raises(InvalidOptionError, match="dma_bandwidth_gbps"):
        simaccel.configure(dma_bandwidth_gbps=0)
    with pytest.raises(InvalidOptionError, match="unknown"):
        simaccel.configure(colour="blue")
    with simaccel.configure(dma_channels=2) as cfg:
        assert cfg.dma_channels == 2
    assert simaccel.get_device().config == before


def test_misaligned_input_takes_the_staging_path_aligned_the_direct_one():
    device = simaccel.get_device()
    base = torch.randn(1025)
    aligned, misaligned = base[:1024], base[1:]  # the view at a 4-byte offset
    assert aligned.data_ptr() % device.config.alignment == 0
    assert misaligned.data_ptr() % device.config.alignment != 0
    for x, staged in ((aligned, 0), (misaligned, 1)):
        torch._dynamo.reset()
        device.reset_stats()
        out = torch.compile(lambda t: t * 2 + 1, backend="simaccel")(x)
        torch.testing.assert_close(out, x * 2 + 1)
        dma = device.dma_stats()
        assert dma["staged.transfers"] == staged
        assert dma["h2d.bytes"] == x.numel() * 4


def test_unloaded_programs_free_their_memory_and_upload_again_at_the_next_call():
    """``Device.unload_programs`` (what ``simaccel.distributed.shutdown`` calls): a live
    compiled model gives back every block, and its next call re-uploads its weights."""
    torch.manual_seed(0)
    model, x = Head().eval(), torch.randn(4, 32)
    device = simaccel.get_device()
    gc.collect()
    baseline = device.memory_stats()["allocated_bytes.all.current"]
    compiled = torch.compile(model, backend="simaccel", dynamic=False)
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-6)
        assert device.memory_stats()["allocated_bytes.all.current"] > baseline
        assert device.unload_programs() > 0
        assert device.memory_stats()["allocated_bytes.all.current"] == baseline
        uploads = device.runtime_stats()["resident_uploads"]
        torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-6)
    assert device.runtime_stats()["resident_uploads"] > uploads

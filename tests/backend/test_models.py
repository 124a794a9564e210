"""End-to-end: plain-torch models compiled with simaccel equal eager, run on the device
(kernels launched, DMA both ways, no host fallback) as one Dynamo graph."""
from __future__ import annotations

import copy
import gc

import pytest
import torch
from torch._dynamo.utils import counters

import simaccel
from tests.backend.models import TransformerBlock, cnn, mlp

RTOL, ATOL = 1e-4, 1e-5


def assert_ran_on_device(expect_graphs: int = 1) -> None:
    rt, dma = simaccel.get_device().runtime_stats(), simaccel.get_device().dma_stats()
    assert rt["kernel_launches"] > 0
    assert rt["host_fallback_ops"] == 0
    assert dma["h2d.bytes"] > 0 and dma["d2h.bytes"] > 0
    assert counters["stats"]["unique_graphs"] == expect_graphs


@pytest.mark.parametrize("name,make,inputs", [
    ("mlp", mlp, lambda: (torch.randn(8, 16),)),
    ("cnn", cnn, lambda: (torch.randn(2, 3, 8, 8),)),
    ("transformer", TransformerBlock, lambda: (torch.randint(0, 50, (2, 8)),)),
])
def test_inference_equals_eager(name, make, inputs):
    torch.manual_seed(0)
    model = make().eval()
    args = inputs()
    with torch.no_grad():
        expected = model(*args)
        got = torch.compile(model, backend="simaccel")(*args)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)
    assert_ran_on_device()


def group_norm_net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GroupNorm(4, 8),
                               torch.nn.SiLU(), torch.nn.Flatten(), torch.nn.Linear(512, 4))


@pytest.mark.parametrize("name,make,shape", [("mlp", mlp, (8, 16)), ("cnn", cnn, (2, 3, 8, 8)),
                                             ("group_norm", group_norm_net, (2, 3, 8, 8))])
def test_training_step_gradients_equal_eager(name, make, shape):
    torch.manual_seed(0)
    model = make().train()
    twin = copy.deepcopy(model)
    x = torch.randn(*shape)
    loss_ref = twin(x).square().mean()
    loss_ref.backward()
    loss = torch.compile(model, backend="simaccel")(x).square().mean()
    loss.backward()
    torch.testing.assert_close(loss, loss_ref, rtol=RTOL, atol=ATOL)
    for (pname, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL, msg=pname)
    if name == "cnn":  # batch norm running stats are updated as in eager
        torch.testing.assert_close(model[1].running_mean, twin[1].running_mean)
        torch.testing.assert_close(model[1].running_var, twin[1].running_var)
    assert simaccel.get_device().runtime_stats()["graphs_compiled"] == 2  # forward + backward
    assert_ran_on_device()


def train_beside_eager(model: torch.nn.Module, shape: tuple[int, ...], steps: int, lr: float,
                       rtol: float, atol: float) -> None:
    """``steps`` SGD steps of ``model`` with its loss compiled, beside an eager copy on
    the same inputs; the parameters must stay equal."""
    twin = copy.deepcopy(model)
    opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=lr) for m in (model, twin))
    step = torch.compile(lambda x: model(x).square().mean(), backend="simaccel")
    for _ in range(steps):
        x = torch.randn(*shape)
        for o, loss in ((opt, step(x)), (opt_ref, twin(x).square().mean())):
            o.zero_grad()
            loss.backward()
            o.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=rtol, atol=atol)


def test_optimizer_loop_matches_eager():
    torch.manual_seed(0)
    train_beside_eager(mlp(), (8, 16), 3, 0.1, RTOL, ATOL)


def test_a_wide_linear_layer_runs_as_the_inner_product_and_equals_eager(monkeypatch):
    """A linear layer of at least ``ONEDNN_PLAIN_MIN_MACS`` multiply-adds runs as oneDNN's inner
    product (simaccel.codegen.library), and its gradients in training equal eager's."""
    from simaccel.codegen import library
    calls = []
    primitive = library._ONEDNN_LINEAR
    monkeypatch.setattr(library, "_ONEDNN_LINEAR",
                        lambda *a: calls.append((tuple(a[0].shape), tuple(a[1].shape)))
                        or primitive(*a))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 512))
    twin = copy.deepcopy(model)
    x = torch.randn(64, 512)
    loss = torch.compile(model, backend="simaccel")(x).square().mean()
    loss.backward()
    loss_ref = twin(x).square().mean()
    loss_ref.backward()
    # sums of 512-1024 products blocked differently by the two libraries
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-5)
    for (pname, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=pname)
    # (activation, weight) shapes: the forward's two products. The backward reads the
    # second layer's weight as it is stored (AOTAutograd's min-cut partitioner saves the
    # weight, not its transpose), row-major for grad (64, 512) @ weight (512, 1024), and
    # the weight gradients read a transposed activation: all on torch.mm
    assert calls == [((64, 512), (1024, 512)), ((64, 1024), (512, 1024))]
    assert_ran_on_device()


def test_an_unchanging_wide_weight_is_read_reordered_and_a_changed_one_as_it_is(monkeypatch):
    """Inference: once a wide linear layer's resident weight has kept its contents for
    ``REORDER_AFTER`` calls, the inner product reads oneDNN's reordered copy, held in
    device memory the program reserves, and still equals eager. Changing a weight in
    place drops its copy (the memory goes back) and the next call reads the new weight;
    the copy comes back once the weight stays. Deleting the model frees it all."""
    from simaccel.codegen import library
    reordered = []
    primitive = library._ONEDNN_LINEAR
    monkeypatch.setattr(library, "_ONEDNN_LINEAR",
                        lambda *a: reordered.append(a[1].is_mkldnn) or primitive(*a))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 512)).eval()
    device = simaccel.get_device()
    gc.collect()
    baseline = device.memory_stats()["allocated_bytes.all.current"]
    compiled = torch.compile(model, backend="simaccel", dynamic=False)
    x = torch.randn(64, 512)
    weight_bytes = 512 * 1024 * 4

    def call() -> tuple[list[bool], int, int]:
        reordered.clear()
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        return (list(reordered), device.runtime_stats()["derived_operands"],
                device.memory_stats()["allocated_bytes.all.current"])
    for _ in range(library.REORDER_AFTER):
        assert call()[:2] == ([False, False], 0)
    used, count, held = call()
    assert used == [True, True] and count == 2
    with torch.no_grad():
        model[0].weight.mul_(-1.0)
    used, count, after_change = call()
    assert used == [False, True] and count == 2
    assert held - after_change >= weight_bytes  # the stale copy's memory went back
    for _ in range(library.REORDER_AFTER - 1):
        call()
    used, count, again = call()
    assert used == [True, True] and count == 3 and again == held
    assert_ran_on_device()
    del compiled
    torch._dynamo.reset()
    gc.collect()
    assert device.memory_stats()["allocated_bytes.all.current"] == baseline


def test_over_dynamic_batch_sizes_one_reordered_copy_serves_every_size(monkeypatch):
    """Over dynamic sizes each batch size binds launches of its own; the copy one of
    them reorders is the step's, read by the others too (oneDNN takes it at any batch),
    and counted once."""
    from simaccel.codegen import library
    reordered = []
    primitive = library._ONEDNN_LINEAR
    monkeypatch.setattr(library, "_ONEDNN_LINEAR",
                        lambda *a: reordered.append((a[0].shape[0], a[1].is_mkldnn))
                        or primitive(*a))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 512)).eval()
    compiled = torch.compile(model, backend="simaccel", dynamic=True)
    with torch.no_grad():
        for batch in (64, 48, 64, 64, 48):
            x = torch.randn(batch, 512)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    # batch 64 reorders at its third call (the fourth call); batch 48's second call
    # then reads the same copies
    assert reordered[-4:] == [(64, True), (64, True), (48, True), (48, True)]
    assert simaccel.get_device().runtime_stats()["derived_operands"] == 2
    assert_ran_on_device()


def test_weights_an_optimizer_changes_every_step_are_never_reordered(monkeypatch):
    """Training: the forward's products read the weights the optimizer changes every
    step in host memory (host-mapped: a training graph's parameters), so no product
    keeps a reordered copy (its cost would come back every step)."""
    from simaccel.codegen import library
    made = []
    launch = library.ResidentWeightLinear
    monkeypatch.setattr(library, "ResidentWeightLinear",
                        lambda *a: made.append(launch(*a)) or made[-1])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 512))
    train_beside_eager(model, (64, 512), 4, 0.01, 1e-4, 1e-5)
    assert not made
    assert simaccel.get_device().runtime_stats()["derived_operands"] == 0
    forward = [r for r in simaccel.reports() if r.graph.endswith("_forward")][-1]
    assert len(forward.host_mapped) >= 2  # both weights
    assert_ran_on_device()

"""Training steps as users write them: a compiled model with a compiled ``opt.step``
(SGD with momentum), and a whole training step compiled, ``loss.backward()`` inside.

Losses and parameters equal eager's after every step; every graph ran on the device.
The weights a training graph reads are read in place (host-mapped) instead of uploaded
again after each optimizer step, and a compiled step that calls ``backward()`` breaks
its graph exactly where Dynamo's eager backend does (simaccel's backward compiler is
not traced by Dynamo)."""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch._dynamo.utils import counters

import simaccel
from simaccel.runtime.spec import Placement

#: max abs difference from eager's parameters after any step (float32; fused kernels
#: round some products once where eager rounds twice)
MAX_ABS_ERROR = 2e-5


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def _batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 64, generator=gen), torch.randint(0, 10, (32,), generator=gen))
            for _ in range(count)]


def _max_difference(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def _assert_on_device() -> None:
    stats = simaccel.get_device().runtime_stats()
    assert stats["kernel_launches"] > 0 and stats["host_fallback_ops"] == 0, stats
    assert simaccel.get_device().dma_stats()["h2d.bytes"] > 0


def _train(model: nn.Module, opt: torch.optim.Optimizer, forward, step, x, y) -> float:
    loss = nn.functional.cross_entropy(forward(x), y)
    loss.backward()
    step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def test_compiled_model_and_optimizer_step_equal_eager():
    """``torch.compile(model)`` and ``torch.compile(opt.step)``, SGD with momentum, six
    steps: losses and parameters equal eager's; after the first steps no weight is
    uploaded again (the forward and backward read the weights the step changed in host
    memory), and the optimizer reads the gradients and updates the weights in place."""
    model, reference = _mlp(), _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    forward = torch.compile(model, backend="simaccel")
    step = torch.compile(opt.step, backend="simaccel")
    device = simaccel.get_device()
    for k, (x, y) in enumerate(_batches(6)):
        if k == 3:  # every program compiled and called: count steady steps only
            device.reset_stats()
        loss = _train(model, opt, forward, step, x, y)
        expected = _train(reference, ref_opt, reference, ref_opt.step, x, y)
        assert abs(loss - expected) <= 1e-5
        assert _max_difference(model, reference) <= MAX_ABS_ERROR
    _assert_on_device()
    stats = device.runtime_stats()
    weight_bytes = sum(p.numel() * 4 for p in model.parameters() if p.dim() == 2)
    assert stats["resident_bytes"] < weight_bytes / 10, stats  # biases at most
    mapped = {index for r in simaccel.reports() for index, _, _ in r.host_mapped}
    assert mapped, "no training graph reads its weights in place"


def test_training_step_compiled_whole_with_backward_inside():
    """A training step compiled whole: Dynamo breaks the graph at ``backward()`` (as it
    does for every backend), AOTAutograd compiles the backward at its first run from
    inside the compiled frame. simaccel's backward compiler runs untraced, so the graph
    breaks are Dynamo eager's, and the gradients and parameters equal eager's."""
    def make_step(model, opt):
        def train_step(x, y):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return train_step

    breaks = {}
    models = {}
    for backend in ("eager", "simaccel"):
        torch._dynamo.reset()
        counters.clear()
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        step = torch.compile(make_step(model, opt), backend=backend)
        losses = [step(x, y).item() for x, y in _batches(4)]
        breaks[backend] = sum(counters["graph_break"].values())
        models[backend] = (model, losses)
    reference = _mlp()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    expected = [make_step(reference, ref_opt)(x, y).item() for x, y in _batches(4)]
    model, losses = models["simaccel"]
    assert breaks["simaccel"] == breaks["eager"] >= 1
    assert max(abs(a - b) for a, b in zip(losses, expected)) <= 1e-5
    assert _max_difference(model, reference) <= MAX_ABS_ERROR
    assert any(r.graph.endswith("_backward") for r in simaccel.reports())
    _assert_on_device()


class _FlatParameters(nn.Module):
    """Two layers whose weights are views of one flat buffer at offsets no DMA alignment
    divides (as frameworks that flatten parameters lay them out)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        flat = torch.randn(20000) * 0.1
        self.w1 = nn.Parameter(flat[3:3 + 128 * 64].view(128, 64))
        self.w2 = nn.Parameter(flat[10001:10001 + 10 * 128].view(10, 128))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.w1.t()) @ self.w2.t()


def test_weights_at_unaligned_addresses_are_read_in_place():
    model = _FlatParameters()
    reference = copy.deepcopy(model)
    assert model.w1.data_ptr() % simaccel.get_device().config.alignment
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    forward = torch.compile(model, backend="simaccel")
    for x, y in _batches(3):
        loss = _train(model, opt, forward, opt.step, x, y)
        assert abs(loss - _train(reference, ref_opt, reference, ref_opt.step, x, y)) <= 1e-5
        assert _max_difference(model, reference) <= MAX_ABS_ERROR
    _assert_on_device()
    assert simaccel.get_device().dma_stats()["h2d.mapped_reads"] > 0


def test_frozen_weights_stay_resident():
    """A weight that needs no grad (a frozen layer under fine-tuning) is not updated
    between calls: it stays resident, uploaded once."""
    model = _mlp()
    model[0].requires_grad_(False)
    reference = copy.deepcopy(model)
    forward = torch.compile(model, backend="simaccel")
    device = simaccel.get_device()
    for k, (x, y) in enumerate(_batches(4)):
        if k == 2:
            device.reset_stats()
        nn.functional.cross_entropy(forward(x), y).backward()
        nn.functional.cross_entropy(reference(x), y).backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        if p.requires_grad:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    _assert_on_device()
    assert device.runtime_stats()["resident_uploads"] == 0
    name = [r.graph for r in simaccel.reports() if r.graph.endswith("_forward")][-1]
    forward = next(p for p in device.programs() if p.spec.name == name)
    placement_by_numel = {forward.spec.buffers[plan.buffer].numel: plan.placement
                          for plan in forward.spec.inputs}
    assert placement_by_numel[128 * 64] is Placement.RESIDENT  # frozen
    assert placement_by_numel[128 * 128] is Placement.MAPPED  # trained


def test_the_backward_writes_weight_gradients_into_the_gradient_tensors():
    """The backward's GEMMs write the weight gradients straight into the tensors the
    caller gets (host-mapped outputs of a library GEMM, patched to each call's new
    arrays), and the forward's saved activations are the very buffers its next GEMM read
    (no second kernel computes them again): parameters equal eager's step after step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    forward = torch.compile(model, backend="simaccel")
    gen = torch.Generator().manual_seed(2)
    for _ in range(4):
        x, y = torch.randn(64, 256, generator=gen), torch.randint(0, 10, (64,), generator=gen)
        loss = _train(model, opt, forward, opt.step, x, y)
        assert abs(loss - _train(reference, ref_opt, reference, ref_opt.step, x, y)) <= 1e-5
        assert _max_difference(model, reference) <= MAX_ABS_ERROR
    _assert_on_device()
    backward = [r for r in simaccel.reports() if r.graph.endswith("_backward")][-1]
    gradient_bytes = 1024 * 256 * 4
    assert any(nbytes == gradient_bytes for _, _, nbytes in backward.host_mapped_outputs), \
        backward.host_mapped_outputs
    forward_report = [r for r in simaccel.reports() if r.graph.endswith("_forward")][-1]
    parameter_bytes = {p.numel() * 4 for p in model.parameters()}  # four sizes
    assert parameter_bytes <= {nbytes for _, _, nbytes in forward_report.host_mapped}, \
        forward_report.host_mapped  # each bias too: it is read once

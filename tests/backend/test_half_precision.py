"""bfloat16 and float16 on the device: buffers hold the 16-bit values, kernels compute in
float32 and round once on store (as inductor's fused kernels do; eager rounds after every
op), DMA moves half the bytes of float32, autocast graphs run on the device.

Tolerances are torch.testing's defaults for these dtypes, the ones inductor's own tests
compare with: bfloat16 rtol 1.6e-2, float16 rtol 1e-3 (atol 1e-5 both). Where rounding
once is the more exact answer, the check is against a float32 reference instead: the
device result is no further from it than eager's.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import simaccel
from tests.backend.test_ops import randn, table_fn
from tests.conftest import check

HALF = [torch.float16, torch.bfloat16]
#: torch.testing.assert_close's defaults for the 16-bit floats
TOL = {torch.float16: {"rtol": 1e-3, "atol": 1e-5}, torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-5}}
#: one rounding step of each dtype (2**-mantissa bits), for the float32-reference checks
ULP = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}

OPS = {
    "add": lambda x: x + 1, "exp": torch.exp, "mul_scalar": lambda x: x * 0.1,
    "sum": lambda x: x.sum(1), "softmax": lambda x: torch.softmax(x, -1),
    "mm": lambda x: x @ x.t(), "from_float32": lambda x: x.float().exp().to(x.dtype),
    "to_float32": lambda x: x.float() * 3,
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_precision_ops_run_on_the_device(dtype: torch.dtype) -> None:
    result = check(table_fn(OPS), randn(4, 5, dtype=dtype), **TOL[dtype])
    outputs = result.outputs
    assert all(outputs[name].dtype == dtype for name in OPS if name != "to_float32")


def _error(values: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|values - exact| relative to |exact| (to 1e-2 below it: cancellation near 0)."""
    return (values.float() - exact).abs() / exact.abs().clamp_min(1e-2)


def _check_against_float32(fn, dtype: torch.dtype, *args: torch.Tensor,
                           reference=None) -> None:
    """Compiled in ``dtype``: on the device, within the roundings eager adds (2 ulp of the
    dtype, relative to the values and absolute: the intermediates are of order 1) of
    eager in that dtype, and no further from the float32 reference than eager is
    (inductor's ``reference_in_float`` check; ``reference``: the float32 function, when
    ``fn`` on float32 inputs does not compute in float32)."""
    result = check(fn, *args, rtol=2 * ULP[dtype], atol=2 * ULP[dtype])
    exact = (reference or fn)(*(a.float() for a in args)).float()
    device_err, eager_err = _error(result.outputs, exact), _error(fn(*args), exact)
    assert result.outputs.dtype == dtype
    assert device_err.max() <= eager_err.max() + 1e-6, (device_err.max(), eager_err.max())
    assert device_err.mean() <= eager_err.mean() + 1e-6, (device_err.mean(), eager_err.mean())


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_fused_chain_rounds_once(dtype: torch.dtype) -> None:
    """exp(x) * 0.5 + x, one kernel: one rounding where eager rounds three times."""
    def fn(x):
        return torch.exp(x) * 0.5 + x
    _check_against_float32(fn, dtype, randn(64, 32, dtype=dtype))


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_dma_moves_half_the_bytes_of_float32(dtype: torch.dtype) -> None:
    def fn(x):
        return torch.tanh(x) * 2
    moved = {}
    for dt in (torch.float32, dtype):
        result = check(fn, randn(256, 64, dtype=dt), **TOL.get(dt, {}))
        moved[dt] = result.dma_stats["h2d.bytes"] + result.dma_stats["d2h.bytes"]
    assert moved[dtype] * 2 == moved[torch.float32], moved


class Block(nn.Module):
    """A pre-norm transformer block: layer norm, multi-head attention, GELU MLP."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to max |b| (bf16 gradients near 0 have no useful rtol)."""
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).pow(2).mean().sqrt().item()


def _float64_grads(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradients of ``model``'s weights (as they were before its step) in float64."""
    exact = Block().double()
    exact.load_state_dict(model.state_dict())
    exact(x.double()).sum().backward()
    return {name: p.grad for name, p in exact.named_parameters()}


def test_bfloat16_transformer_block_forward_and_backward_on_the_device() -> None:
    torch.manual_seed(0)
    model = Block().to(torch.bfloat16)
    reference = Block().to(torch.bfloat16)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    simaccel.get_device().reset_stats()
    out = torch.compile(model, backend="simaccel")(x)
    out.float().sum().backward()
    expected = reference(x)
    expected.float().sum().backward()
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape
    # bf16 keeps 8 bits: 1.6e-2 (torch's bf16 rtol) of the largest value for the output
    assert _max_rel(out, expected) <= 1.6e-2
    exact = _float64_grads(model, x)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        # Gradients: linear layers are bf16 GEMMs rounded as eager rounds them, but the
        # roundings around them differ from eager's (fused kernels round once), so the
        # two drift apart more than either from the truth (measured: ln1.weight 1.7% of
        # eager's, inductor's 1.4%). Checked as PyTorch's benchmark suites check a
        # low-precision training run (torch._dynamo.utils.same, fp64 reference): no
        # further from a float64 run than 2x eager's RMSE plus tol/10; and within twice
        # the output's bound of eager.
        assert p.grad.dtype == torch.bfloat16 and _max_rel(p.grad, q.grad) <= 3.2e-2, name
        assert _rmse(p.grad, exact[name]) <= 2 * _rmse(q.grad, exact[name]) + 1.6e-3, name
    stats = simaccel.get_device().runtime_stats()
    assert stats["host_fallback_ops"] == 0 and stats["kernel_launches"] > 0, stats
    assert stats["graphs_compiled"] == 2  # forward and backward


def test_autocast_graph_runs_on_the_device() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))

    def fn(x):
        with torch.autocast("cpu", torch.bfloat16):
            return model(x)
    with torch.no_grad():
        _check_against_float32(fn, torch.bfloat16, torch.randn(4, 16), reference=model)


def test_a_bfloat16_linear_layer_is_one_library_gemm_rounded_as_eager() -> None:
    """A bfloat16 linear layer runs as the library's bfloat16 GEMM with the bias added
    before its one rounding (eager's addmm): equal to eager, no kernel of its own for
    the bias. A batched bfloat16 GEMM stays a float32 GEMM read unrounded."""
    torch.manual_seed(0)
    layer = nn.Linear(64, 48).to(torch.bfloat16)
    with torch.no_grad():
        result = check(layer, torch.randn(8, 64, dtype=torch.bfloat16), rtol=0, atol=0)
    kernels = result.reports[-1].kernels
    assert [(k.kind, k.path) for k in kernels] == [("library", "gemm_bfloat16_bias")], kernels
    _check_against_float32(lambda a, b: torch.softmax(a @ b, -1), torch.bfloat16,
                           randn(2, 8, 16, dtype=torch.bfloat16),
                           randn(2, 16, 8, dtype=torch.bfloat16))
    assert [k.path for k in simaccel.reports()[-1].kernels if k.kind == "library"] == ["gemm"]

"""Workloads shared by ``simaccel bench`` and the pytest-benchmark suites in ``bench/``.

Three kinds:

* scalar scenarios: a program whose result depends on one Python scalar stored in one
  place (argument, global, module attribute, closure cell, ...); ``args_for(value)``
  stores the value there and returns the call arguments;
* kernel workloads: a function and its inputs, at full or quick (tiny) sizes;
* the cold/warm compile workload (a 3-layer MLP), run in a fresh process.
"""
from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from simaccel.bench.gpt2 import gpt2

#: globals the scalar scenarios read: Dynamo bakes their value into the graph.
GAIN = 2.0
STEPS = 3

#: every value handed to a scenario is new in this process and (random start) almost
#: surely in earlier runs, so no backend can reuse a graph compiled for an earlier value,
#: not even from inductor's on-disk FX graph cache.
_FRESH = itertools.count(random.SystemRandom().randrange(1, 1 << 20))

ScenarioFn = Callable[..., Any]
ArgsFor = Callable[[Any], tuple]


def fresh_value(kind: str) -> float | int:
    """A scalar never handed out before in this process: float in [0.5, 1.5), int >= 2."""
    k = next(_FRESH)
    if kind == "int":
        return 2 + k
    return 0.5 + (k * 0.6180339887) % 1.0


@dataclass(frozen=True)
class ScalarScenario:
    """One place a Python scalar lives; ``build(numel)`` returns ``(fn, args_for)``."""

    name: str
    kind: str  # "float" or "int"
    build: Callable[[int], tuple[ScenarioFn, ArgsFor]]
    what: str


class _FloatModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 1.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * self.scale


class _IntModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * self.k + 1


def _float_arg(numel: int) -> tuple[ScenarioFn, ArgsFor]:
    def fn(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return torch.sin(x) * alpha
    x = torch.randn(numel)
    return fn, lambda v: (x, v)


def _int_arg(numel: int) -> tuple[ScenarioFn, ArgsFor]:
    def fn(x: torch.Tensor, n: int) -> torch.Tensor:
        return torch.sin(x) * n + n
    x = torch.randn(numel)
    return fn, lambda v: (x, v)


def _float_global(numel: int) -> tuple[ScenarioFn, ArgsFor]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cos(x) * GAIN
    x = torch.randn(numel)

    def args_for(v: float) -> tuple:
        globals()["GAIN"] = v
        return (x,)
    return fn, args_for


def _module_attr(module: nn.Module, attr: str, numel: int) -> tuple[ScenarioFn, ArgsFor]:
    x = torch.randn(numel)

    def args_for(v: Any) -> tuple:
        setattr(module, attr, v)
        return (x,)
    return module, args_for


def _closure(numel: int) -> tuple[ScenarioFn, ArgsFor]:
    scale = 1.0

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * scale
    x = torch.randn(numel)

    def args_for(v: float) -> tuple:
        fn.__closure__[0].cell_contents = v  # type: ignore[index]
        return (x,)
    return fn, args_for


def _temperature(numel: int) -> tuple[ScenarioFn, ArgsFor]:
    def fn(logits: torch.Tensor, temperature: float) -> torch.Tensor:
        return torch.softmax(logits / temperature, dim=-1)
    logits = torch.randn(max(numel // 64, 1), 64)
    return fn, lambda v: (logits, v)


def _lr_warmup(numel: int) -> tuple[ScenarioFn, ArgsFor]:
    def sgd_step(p: torch.Tensor, g: torch.Tensor, lr: float) -> torch.Tensor:
        return p - lr * g
    p, g = torch.randn(numel), torch.randn(numel)
    # lr = base * step / warmup grows every step: a new float per call
    return sgd_step, lambda v: (p, g, 1e-3 * v)


SCALAR_SCENARIOS: dict[str, ScalarScenario] = {s.name: s for s in (
    ScalarScenario("float_arg", "float", _float_arg, "float argument"),
    ScalarScenario("int_arg", "int", _int_arg, "int argument"),
    ScalarScenario("float_global", "float", _float_global, "module-level global"),
    ScalarScenario("module_float_attr", "float",
                   lambda n: _module_attr(_FloatModule(), "scale", n), "nn.Module float attr"),
    ScalarScenario("module_int_attr", "int",
                   lambda n: _module_attr(_IntModule(), "k", n), "nn.Module int attr"),
    ScalarScenario("closure", "float", _closure, "closure cell"),
    ScalarScenario("temperature", "float", _temperature, "softmax(logits / T)"),
    ScalarScenario("lr_warmup", "float", _lr_warmup, "p - lr * g, lr warming up"),
)}


# ---------------------------------------------------------------------- kernel workloads


def tiny(x: torch.Tensor) -> torch.Tensor:
    """The steady per-call overhead graph: two pointwise ops on 16 elements."""
    return x * 2.0 + 1.0


def chain8(x: torch.Tensor) -> torch.Tensor:
    """Eight pointwise ops: one fused kernel on simaccel."""
    return ((((x * 2.0 + 1.0).sin() - 0.5).abs().sqrt() * 3.0).tanh() + 1.0).relu()


def row_reductions(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x.sum(-1), x.amax(-1), x.mean(-1)


def layernorm_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     keep: torch.Tensor) -> torch.Tensor:
    """Attention over padded sequences: ``keep`` (batch, 1, 1, keys) is False on padding."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def mlp(d_in: int, hidden: int, d_out: int) -> nn.Module:
    """Linear-GELU-Linear in eval mode."""
    return nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_out)).eval()


def mlp3(d_in: int = 256, hidden: int = 512, d_out: int = 64) -> nn.Module:
    """The cold/warm compile workload: three Linear layers with ReLU, eval mode."""
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, d_out)).eval()


#: Tolerances (rtol, atol) of a kernel workload's result against eager, by how the backend
#: computes it:
#:
#: | backend                 | computes with                              | tolerance           |
#: |-------------------------|--------------------------------------------|---------------------|
#: | eager                   | (the reference)                            | exact               |
#: | dynamo_eager, aot_eager | eager's own ATen kernels, in eager's order | ``ATEN_KERNEL_TOL`` |
#: | inductor, simaccel      | their own kernels: float sums reordered    | the workload's      |
#: |                         | (vector lanes, threads, GEMM blocking) and | ``KernelWorkload.`` |
#: |                         | their own sin/tanh/exp (1-2 ulp apart)     | ``tol``             |
#:
#: The ATen-kernel backends give eager's bits (measured: error 0); torch.testing's float32
#: defaults leave room for nothing more than rounding. The per-workload figures of the
#: own-kernel backends are in ``KERNEL_WORKLOADS``, each with why.
ATEN_KERNEL_TOL = (1.3e-6, 1e-5)
OWN_KERNEL_BACKENDS = ("inductor", "simaccel")


@dataclass(frozen=True)
class KernelWorkload:
    """``make(quick)`` returns ``(fn, args)``; ``sizes`` describes (full, quick) inputs;
    ``tol`` is the (rtol, atol) against eager of a backend with its own kernels (inductor,
    simaccel); :meth:`tol_for` gives every backend's."""

    name: str
    make: Callable[[bool], tuple[ScenarioFn, tuple]]
    sizes: tuple[str, str]
    tol: tuple[float, float] = (1e-4, 1e-4)
    #: False: left out of ``simaccel bench --quick`` unless ``--scenarios`` names it (its
    #: cold numba compiles alone take seconds: the sort and top-k templates, ~6 s)
    in_quick: bool = True

    def tol_for(self, backend: str) -> tuple[float, float]:
        """(rtol, atol) of ``backend``'s result against eager (see the table above)."""
        if backend == "eager":
            return (0.0, 0.0)
        return self.tol if backend in OWN_KERNEL_BACKENDS else ATEN_KERNEL_TOL


def _chain8_workload(quick: bool) -> tuple[ScenarioFn, tuple]:
    return chain8, (torch.randn(64 << 10 if quick else 4 << 20),)


def _mlp_workload(quick: bool) -> tuple[ScenarioFn, tuple]:
    torch.manual_seed(0)
    if quick:
        return mlp(64, 256, 64), (torch.randn(8, 64),)
    return mlp(512, 2048, 512), (torch.randn(64, 512),)


def _ln_workload(quick: bool) -> tuple[ScenarioFn, tuple]:
    rows, cols = (32, 128) if quick else (256, 1024)
    return layernorm_gelu, (torch.randn(rows, cols), torch.randn(cols), torch.randn(cols))


def _attn_workload(quick: bool) -> tuple[ScenarioFn, tuple]:
    shape = (1, 2, 16, 8) if quick else (4, 8, 128, 64)
    return causal_attention, tuple(torch.randn(*shape) for _ in range(3))


def _masked_attn_workload(quick: bool) -> tuple[ScenarioFn, tuple]:
    """Encoder-style attention over a batch of padded sequences (the first padded by a
    quarter of its keys): a boolean padding mask, no causal mask."""
    torch.manual_seed(0)
    batch, heads, length, dim = (1, 2, 16, 8) if quick else (4, 8, 128, 64)
    keep = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    keep[0, ..., length - length // 4:] = False
    return masked_attention, (*(torch.randn(batch, heads, length, dim) for _ in range(3)),
                              keep)


def _gpt2_workload(quick: bool) -> tuple[ScenarioFn, tuple]:
    """Issue 16's steady forward: the GPT-2-style decoder (:mod:`simaccel.bench.gpt2`), 6
    layers of width 128 over 2 x 64 tokens (quick: 1 layer, 2 x 16)."""
    return gpt2(1, 2, 16) if quick else gpt2(6, 2, 64)


def _reductions_workload(quick: bool) -> tuple[ScenarioFn, tuple]:
    return row_reductions, (torch.randn(*((64, 128) if quick else (4096, 1024))),)


def _static_reductions_workload(quick: bool) -> tuple[ScenarioFn, tuple]:
    """The row reductions on an input marked with ``torch._dynamo.mark_static_address``:
    data that lives on the device across calls (a KV cache, a lookup table, optimizer
    state), so a backend need not copy it in again while it is unchanged."""
    fn, (x,) = _reductions_workload(quick)
    torch._dynamo.mark_static_address(x)
    return fn, (x,)


def _bf16(make: Callable[[bool], tuple[ScenarioFn, tuple]]
          ) -> Callable[[bool], tuple[ScenarioFn, tuple]]:
    """``make`` with its float32 inputs and parameters in bfloat16 (same sizes)."""
    def make_bf16(quick: bool) -> tuple[ScenarioFn, tuple]:
        fn, args = make(quick)
        if isinstance(fn, nn.Module):
            fn = fn.to(torch.bfloat16)
        return fn, tuple(a.to(torch.bfloat16) if a.is_floating_point() else a for a in args)
    return make_bf16


def _distinct(rows: int, cols: int) -> torch.Tensor:
    """``rows x cols`` float32 values, all different (a random permutation of the integers
    below rows * cols, exact in float32 up to 2**24): sort and topk indices have no ties."""
    torch.manual_seed(0)
    return torch.randperm(rows * cols).to(torch.float32).view(rows, cols)


def sort_last(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.sort(x, dim=-1)


def topk16(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.topk(x, 16, dim=-1)


def grouped_conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """3x3 convolution, 8 groups, same padding."""
    return F.conv2d(x, w, padding=1, groups=8)


def _sort_workload(quick: bool) -> tuple[ScenarioFn, tuple]:
    return sort_last, (_distinct(*((16, 256) if quick else (1024, 4096))),)


def _topk_workload(quick: bool) -> tuple[ScenarioFn, tuple]:
    return topk16, (_distinct(*((16, 256) if quick else (1024, 4096))),)


def _grouped_conv_workload(quick: bool) -> tuple[ScenarioFn, tuple]:
    torch.manual_seed(0)
    batch, side = (1, 8) if quick else (8, 56)
    return grouped_conv, (torch.randn(batch, 64, side, side), torch.randn(64, 8, 3, 3) * 0.1)


#: ``tol`` of each workload for the own-kernel backends (largest error seen in brackets):
#:
#: | workload         | (rtol, atol)   | why                                                   |
#: |------------------|----------------|-------------------------------------------------------|
#: | chain8           | (1e-4, 1.5e-3) | ``3 * sqrt(|sin(2x + 1) - 0.5|)`` near its root turns |
#: |                  |                | a 1-2 ulp difference of sin (ulp(0.5) = 6e-8) into up |
#: |                  |                | to 3 * sqrt(2 * 6e-8) = 1.04e-3 (inductor: 7.3e-4)    |
#: | mlp              | (1e-3, 1e-3)   | GEMM sums of 512-2048 products, blocked differently   |
#: | layernorm_gelu   | (1e-4, 1e-4)   | row mean and variance over 1024, reordered (3e-6)     |
#: | causal_attention | (1e-3, 1e-4)   | softmax of 128-long rows between two GEMMs            |
#: | masked_attention | (1e-3, 1e-4)   | the same, padded keys masked                          |
#: | gpt2             | (1e-3, 1e-3)   | logits after 6 blocks of GEMMs, layer norms, softmax  |
#: | row_reductions*  | (1e-4, 1e-3)   | sums of 1024 N(0, 1) values (~32), reordered (4e-5)   |
#: | *_bf16           | rtol 1.6e-2    | bfloat16 inputs and parameters; inductor and simaccel |
#: |                  | (2 bf16 eps)   | compute in float32 and round once, eager rounds each  |
#: |                  |                | op's result to bfloat16:                              |
#: | chain8_bf16      | atol 0.6       | 2x + 1 rounded (half ulp of 8..16: 0.031) moves sin   |
#: |                  |                | near 0.5 by up to 0.033: 3 * sqrt(0.033) = 0.55       |
#: |                  |                | (0.234, inductor the same 0.234)                      |
#: | layernorm_gelu_. | atol 1e-3      | the normalized row rounded before GELU (1.8e-4)       |
#: | mlp_bf16         | atol 8e-3      | eager rounds the hidden layer: 2 ulps of 0.5..1 (2e-3)|
#: | causal_attention_| atol 1e-2      | eager rounds the weights before their GEMM, simaccel  |
#: | bf16             |                | computes in float32 and rounds the output once (7e-3) |
#: | sort_last, topk16| exact          | distinct values: no ties, so the indices agree too    |
#: | grouped_conv     | (1e-4, 1e-4)   | sums of 8 * 9 products, reordered (4e-7)              |
KERNEL_WORKLOADS: dict[str, KernelWorkload] = {w.name: w for w in (
    KernelWorkload("chain8", _chain8_workload, ("4M f32", "64K f32"), (1e-4, 1.5e-3)),
    KernelWorkload("mlp", _mlp_workload, ("512-2048-512 b64", "64-256-64 b8"), (1e-3, 1e-3)),
    KernelWorkload("layernorm_gelu", _ln_workload, ("256x1024", "32x128"), (1e-4, 1e-4)),
    KernelWorkload("causal_attention", _attn_workload, ("4x8x128x64", "1x2x16x8"),
                   (1e-3, 1e-4)),
    KernelWorkload("masked_attention", _masked_attn_workload,
                   ("4x8x128x64 padding mask", "1x2x16x8 padding mask"), (1e-3, 1e-4),
                   in_quick=False),
    KernelWorkload("gpt2", _gpt2_workload, ("6 layers, 2x64 tokens", "1 layer, 2x16 tokens"),
                   (1e-3, 1e-3)),
    KernelWorkload("row_reductions", _reductions_workload, ("4096x1024", "64x128"),
                   (1e-4, 1e-3)),
    KernelWorkload("row_reductions_static", _static_reductions_workload,
                   ("4096x1024", "64x128"), (1e-4, 1e-3)),
    KernelWorkload("chain8_bf16", _bf16(_chain8_workload), ("4M bf16", "64K bf16"),
                   (1.6e-2, 0.6)),
    KernelWorkload("layernorm_gelu_bf16", _bf16(_ln_workload),
                   ("256x1024 bf16", "32x128 bf16"), (1.6e-2, 1e-3)),
    KernelWorkload("causal_attention_bf16", _bf16(_attn_workload),
                   ("4x8x128x64 bf16", "1x2x16x8 bf16"), (1.6e-2, 1e-2), in_quick=False),
    KernelWorkload("mlp_bf16", _bf16(_mlp_workload),
                   ("512-2048-512 b64 bf16", "64-256-64 b8 bf16"), (1.6e-2, 8e-3)),
    KernelWorkload("sort_last", _sort_workload, ("1024x4096", "16x256"), (0.0, 0.0),
                   in_quick=False),
    KernelWorkload("topk16", _topk_workload, ("1024x4096 k16", "16x256 k16"), (0.0, 0.0),
                   in_quick=False),
    KernelWorkload("grouped_conv", _grouped_conv_workload,
                   ("8x64x56x56 g8 3x3", "1x64x8x8 g8 3x3"), (1e-4, 1e-4)),
)}


def guard_workload() -> tuple[ScenarioFn, tuple]:
    """A tiny graph reading three Python scalars: each one is a value guard unless lifted."""
    def fn(x: torch.Tensor, a: float, b: float, n: int) -> torch.Tensor:
        return x * a + b * n
    return fn, (torch.randn(16), 0.75, 0.25, 3)


#: a global the scalar workload reads (a value guard unless lifted)
GAIN = 1.25


class ScaledMLP(nn.Module):
    """The 3-layer MLP with three Python scalars: a module float attribute, a global and
    an int argument (the first compile with lifting re-traces once)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp3()
        self.scale = 0.75

    def forward(self, x: torch.Tensor, lr: float, steps: int) -> torch.Tensor:
        return self.net(x) * self.scale * GAIN - lr * steps


def scaled_mlp() -> nn.Module:
    return ScaledMLP().eval()

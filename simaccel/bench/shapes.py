"""``shape/`` scenarios: how each backend handles changing sizes.

* ``batch_sweep``: ``softmax(relu(x) * 3)`` over 10 batch sizes (1..64, a prime among
  them), ``dynamic=None``: graphs compiled, median seconds per call;
* ``kv_growth``: a decoder step whose KV cache grows by one row per step (``torch.cat``):
  32 steps (the compiles), then 32 more timed, each at a cache length not seen before:
  graphs over all 64, median seconds per timed step;
* ``kv_static``: the same decoder over a static cache (preallocated, written with
  ``index_copy_`` at the step's position, a mask of the positions not yet written): every
  step at one size, as decode loops on static-shape hardware run;
* ``dynamic_vs_static`` (simaccel): a kernel workload compiled static and compiled with a
  dynamic batch dim, steady time at the same size (the ratio shows what symbolic sizes
  cost: kernels loop over runtime bounds);
* ``new_size`` (simaccel): a call at a size the dynamic graph has not seen (no compile:
  new memory layout and launch bindings) over a steady call at that size.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from simaccel.bench import measure
from simaccel.bench.scenarios import BenchConfig, Record
from simaccel.bench.workloads import KERNEL_WORKLOADS

BATCHES = (1, 2, 3, 5, 8, 13, 17, 31, 47, 64)
KV_STEPS = 32
#: timed passes over the batch sizes
SWEEP_ROUNDS = 5
#: kernel workloads compared static vs dynamic
DYNAMIC_KERNELS = ("chain8", "row_reductions", "layernorm_gelu", "mlp", "causal_attention")


def _softmax_chain(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(torch.relu(x) * 3, dim=-1)


def _timed_calls(compiled: Callable, calls: list[tuple]) -> list[float]:
    times = []
    with torch.no_grad():
        for args in calls:
            start = time.perf_counter()
            compiled(*args)
            times.append(time.perf_counter() - start)
    return times


def measure_batch_sweep(backend: str, cfg: BenchConfig) -> Record:
    """Graphs and median call time over the batch sweep (each size called twice, then
    :data:`SWEEP_ROUNDS` times timed: compiles are counted, not timed)."""
    measure.fresh_dynamo()
    compiled = measure.compile_for(_softmax_chain, backend, dynamic=None)
    calls = [(torch.randn(b, 64),) for b in BATCHES]
    _timed_calls(compiled, calls)
    # simaccel's background compiles are compile time too, and so is the call at each
    # size that binds their compiled kernels
    measure.settle()
    _timed_calls(compiled, calls)
    # rounds: a core that idled while the workers finished clocks up over a few calls
    times = [t for _ in range(SWEEP_ROUNDS) for t in _timed_calls(compiled, calls)]
    return Record("shape", "batch_sweep[1..64, dynamic=None]", backend, measure.median(times),
                  len(times), {"graphs": measure.graphs_compiled()})


class _Decoder(torch.nn.Module):
    """One attention layer over a growing KV cache."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor):
        q, k, v = self.project(x)
        k, v = torch.cat([k_cache, k], 2), torch.cat([v_cache, v], 2)
        return self.attend(x, q, k, v), k, v

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The step's query, key and value, (batch, heads, tokens, head dim)."""
        b, t, _ = x.shape
        return tuple(z.view(b, t, self.heads, self.head_dim).transpose(1, 2)
                     for z in self.qkv(x).chunk(3, dim=-1))

    def attend(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Softmax attention over the cache (positions where ``hidden`` is True left out)."""
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        if hidden is not None:
            scores = scores.masked_fill(hidden, float("-inf"))
        att = torch.softmax(scores, -1) @ v
        return self.out(att.transpose(1, 2).reshape(*x.shape[:2], -1))


class _StaticDecoder(_Decoder):
    """:class:`_Decoder` over a static cache, as decode loops on static-shape hardware
    keep one: preallocated for ``length`` positions (buffers), written in place at the
    step's position and attended through a mask of the positions not yet written."""

    def __init__(self, length: int, dim: int = 64, heads: int = 4):
        super().__init__(dim, heads)
        for name in ("k_cache", "v_cache"):
            self.register_buffer(name, torch.zeros(1, heads, length, dim // heads))

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(x)
        self.k_cache.index_copy_(2, position, k)
        self.v_cache.index_copy_(2, position, v)
        hidden = torch.arange(self.k_cache.shape[2]) > position
        return self.attend(x, q, self.k_cache, self.v_cache, hidden)


def measure_kv_growth(backend: str, cfg: BenchConfig) -> Record:
    """Graphs and median step time of a decode with a growing cache: :data:`KV_STEPS`
    steps that compile (and recompile), then as many timed steps, each one row longer
    (a new size: no step repeats an earlier one's shapes)."""
    measure.fresh_dynamo()
    torch.manual_seed(0)
    model = _Decoder()
    compiled = measure.compile_for(model, backend, dynamic=None)
    x = torch.randn(1, 1, 64)
    k = v = torch.zeros(1, 4, 1, 16)
    times = []
    with torch.no_grad():
        for step in range(2 * KV_STEPS):
            if step == KV_STEPS:
                measure.settle()  # simaccel's background compiles are compile time too
            start = time.perf_counter()
            _, k, v = compiled(x, k, v)
            times.append(time.perf_counter() - start)
    steady = times[KV_STEPS:]
    return Record("shape", f"kv_growth[{KV_STEPS} steps]", backend, measure.median(steady),
                  len(steady), {"graphs": measure.graphs_compiled()})


def measure_kv_static(backend: str, cfg: BenchConfig) -> Record:
    """:func:`measure_kv_growth`'s decode over a static cache (:class:`_StaticDecoder`):
    every step at the same sizes, the position a tensor input."""
    measure.fresh_dynamo()
    torch.manual_seed(0)
    compiled = measure.compile_for(_StaticDecoder(2 * KV_STEPS), backend, dynamic=None)
    x = torch.randn(1, 1, 64)
    positions = [torch.tensor([step]) for step in range(2 * KV_STEPS)]
    times = []
    with torch.no_grad():
        for step, position in enumerate(positions):
            if step == KV_STEPS:
                measure.settle()
            start = time.perf_counter()
            compiled(x, position)
            times.append(time.perf_counter() - start)
    steady = times[KV_STEPS:]
    return Record("shape", f"kv_static[{KV_STEPS} steps]", backend, measure.median(steady),
                  len(steady), {"graphs": measure.graphs_compiled()})


def _kernel_pair(name: str, quick: bool) -> tuple[Callable, tuple, Callable, Callable]:
    fn, args = KERNEL_WORKLOADS[name].make(quick)
    measure.fresh_dynamo()
    static = torch.compile(fn, backend="simaccel", dynamic=False)
    dynamic = torch.compile(fn, backend="simaccel", dynamic=None)
    dynamic(*_resized(args, 1))  # a first size, then the measured one: dynamic dim 0
    return fn, args, static, dynamic


def _resized(args: tuple, extra: int) -> tuple:
    """``args`` with dim 0 grown by ``extra`` rows in the first tensor and in every tensor
    batched like it (same rank and dim 0: attention's q, k and v grow together; a
    broadcast operand such as chain8's bias row stays)."""
    first = args[0]

    def grow(t):
        if not (isinstance(t, torch.Tensor) and t.dim() == first.dim()
                and t.shape[0] == first.shape[0]):
            return t
        return torch.randn(t.shape[0] + extra, *t.shape[1:], dtype=t.dtype)
    return tuple(grow(a) for a in args)


def measure_dynamic_vs_static(name: str, cfg: BenchConfig) -> Record:
    """Steady seconds per call of the dynamic graph; ``extra["static_s"]`` the static
    graph's at the same size, measured in the same run (interleaved batches)."""
    _, args, static, dynamic = _kernel_pair(name, cfg.quick)
    with torch.no_grad(), measure.quiet_gc():
        static(*args), dynamic(*args)
        batch = measure.batch_size_for(static, args, budget_s=5e-3)
        st, dy = [], []
        for _ in range(cfg.batches):
            st += measure.time_batches(static, args, 1, batch)
            dy += measure.time_batches(dynamic, args, 1, batch)
    graphs = measure.graphs_compiled()
    s, d = measure.median(st), measure.median(dy)
    return Record("shape", f"dynamic_vs_static[{name}]", "simaccel", d, len(dy),
                  {"static_s": s, "dynamic_over_static": d / s if s else None,
                   "graphs": graphs})


def measure_new_size(cfg: BenchConfig) -> Record:
    """Median time of a call at a size not seen before (no compile) over the steady call
    at such a size, on the batch-sweep graph compiled dynamic."""
    measure.fresh_dynamo()
    compiled = torch.compile(_softmax_chain, backend="simaccel", dynamic=True)
    compiled(torch.randn(2, 64))
    sizes = range(3, 3 + (40 if cfg.quick else 120))
    new = _timed_calls(compiled, [(torch.randn(b, 64),) for b in sizes])
    again = _timed_calls(compiled, [(torch.randn(b, 64),) for b in sizes])
    n, s = measure.median(new), measure.median(again)
    return Record("shape", "new_size_call[softmax chain]", "simaccel", n, len(new),
                  {"steady_s": s, "new_over_steady": n / s if s else None,
                   "graphs": measure.graphs_compiled()})


def shape_tasks(backends: list[str], cfg: BenchConfig, task: Callable[..., Any]) -> list[Any]:
    """The ``shape`` group's tasks (``task(group, scenario, backend, fn)`` makes one)."""
    tasks = [task("shape", "batch_sweep[1..64, dynamic=None]", b,
                  lambda b=b: measure_batch_sweep(b, cfg)) for b in backends]
    tasks += [task("shape", f"kv_growth[{KV_STEPS} steps]", b,
                   lambda b=b: measure_kv_growth(b, cfg)) for b in backends]
    tasks += [task("shape", f"kv_static[{KV_STEPS} steps]", b,
                   lambda b=b: measure_kv_static(b, cfg)) for b in backends]
    if "simaccel" in backends:
        tasks += [task("shape", f"dynamic_vs_static[{n}]", "simaccel",
                       lambda n=n: measure_dynamic_vs_static(n, cfg)) for n in DYNAMIC_KERNELS]
        tasks.append(task("shape", "new_size_call[softmax chain]", "simaccel",
                          lambda: measure_new_size(cfg)))
    return tasks

"""``simaccel demo``: a small transformer language model generates tokens while its
sampling temperature and a global logit scale change at every step.

It first times simaccel's first call of the model in two new processes: cold (an empty
kernel cache) and warm (the same cache again). Then it runs the same generation loop in
plain eager PyTorch, under Dynamo's own ``eager`` backend (default scalar handling) and
under simaccel, and prints the recompiles each one paid, what ran on the device, the DMA
and memory stats, and writes a Chrome trace (``simaccel.cli.DEMO_TRACE_FILE`` by
default).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import simaccel
from simaccel.bench.coldstart import compile_package_bytecode

#: a global the model reads: Dynamo bakes its value into the graph and guards on it.
LOGIT_SCALE = 1.0
#: ``python -m simaccel.demo --first-call``: the child process that times one first call.
FIRST_CALL_FLAG = "--first-call"
#: seconds a cold compile of TinyLM may take on a loaded 2-core CI machine.
CHILD_TIMEOUT_S = 600


class TinyBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ff1, self.ff2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x)), approximate="tanh"))


class TinyLM(nn.Module):
    """Embedding, one transformer block, LM head; the next-token distribution is
    ``softmax(logits * LOGIT_SCALE / temperature)``."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, context: int = 16):
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(context, dim) * 0.02)
        self.block = TinyBlock(dim, heads)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
        x = self.tok(tokens) + self.pos
        logits = self.head(self.block(x))[:, -1]
        return torch.softmax(logits * LOGIT_SCALE / temperature, dim=-1)


def generate(step: Callable, steps: int, context: int, seed: int) -> list[int]:
    """Sample ``steps`` tokens; temperature and LOGIT_SCALE change every step."""
    global LOGIT_SCALE
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(1, context, dtype=torch.long)
    out = []
    for i in range(steps):
        LOGIT_SCALE = 1.0 + 0.05 * i
        probs = step(tokens, 0.7 + 0.1 * i)
        nxt = torch.multinomial(probs, 1, generator=gen)
        tokens = torch.cat([tokens[:, 1:], nxt], dim=1)
        out.append(int(nxt))
    return out


@dataclass
class Row:
    """One line of the table: ``graphs`` is ``None`` for plain eager (no Dynamo)."""

    label: str
    graphs: int | None
    seconds: float
    tokens: list[int]


#: what each row runs: ``torch.compile`` backend -> row label (``None``: no torch.compile).
ROW_LABELS = {None: "plain eager", "eager": "Dynamo eager backend", "simaccel": "simaccel"}


def _run(model: TinyLM, backend: str | None, steps: int) -> Row:
    """Generate under ``torch.compile(backend=...)``, or plain eager for ``None``."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    step = model if backend is None else torch.compile(model, backend=backend, dynamic=False)
    start = time.perf_counter()
    # Let the default handling recompile as often as it needs to, so the count is honest
    # (past Dynamo's recompile limit it would silently fall back to eager instead).
    with torch._dynamo.config.patch(recompile_limit=10_000), torch.no_grad():
        tokens = generate(step, steps, model.context, seed=0)
    elapsed = time.perf_counter() - start
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] if backend else None
    return Row(ROW_LABELS[backend], graphs, elapsed, tokens)


def _first_call() -> dict[str, float | int]:
    """In a child process: compile TinyLM with simaccel and time its first call (seconds,
    compile included), with the kernel counts of the device."""
    torch.manual_seed(0)
    model = TinyLM().eval()
    compiled = torch.compile(model, backend="simaccel", dynamic=False)
    tokens = torch.zeros(1, model.context, dtype=torch.long)
    start = time.perf_counter()
    with torch.no_grad():
        compiled(tokens, 0.7)
    seconds = time.perf_counter() - start
    stats = simaccel.get_device().runtime_stats()
    return {"first_call_s": seconds, "kernels_compiled": stats["kernels_compiled"],
            "kernel_cache_hits": stats["kernel_cache_hits"],
            "tier0_kernels": stats.get("tier0_kernels", 0),
            "phases_s": simaccel.compile_times()}


def first_call_in_child(cache_dir: str) -> dict[str, float | int]:
    """:func:`_first_call` in a new Python process whose kernel cache is ``cache_dir``
    (simaccel's modules byte-compiled first, as an installed wheel has them:
    :func:`~simaccel.bench.coldstart.compile_package_bytecode`)."""
    compile_package_bytecode()
    proc = subprocess.run([sys.executable, "-m", "simaccel.demo", FIRST_CALL_FLAG],
                          env={**os.environ, "SIMACCEL_CACHE_DIR": cache_dir},
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"the first-call process failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _print_first_calls(cache_dir: str) -> None:
    """Cold (empty ``cache_dir``), then warm (the same ``cache_dir``), each in a new process."""
    print("first call of simaccel's TinyLM (compile + run), each in a new process:", flush=True)
    tiered = 0
    for label, what in (("cold", "empty kernel cache"), ("warm", "same cache dir")):
        run = first_call_in_child(cache_dir)
        tiered += run["tier0_kernels"]
        print(f"  {label} {run['first_call_s']:6.2f} s  ({what}: {run['tier0_kernels']} kernels "
              f"ran as numpy (tier 0) while numba compiled them in the background, "
              f"{run['kernels_compiled']} compiled before the call, "
              f"{run['kernel_cache_hits']} loaded from disk)", flush=True)
        print("       phases: " + ", ".join(f"{name} {sec:.2f} s"
                                           for name, sec in run["phases_s"].items()))
    if tiered:
        print("  cold runs each new kernel's numpy form at once and switches to numba's machine "
              "code when a worker has compiled it (the process waits for them at exit);\n"
              "  warm loads that machine code from the cache (as the runs below do)\n")
    else:
        print("  cold compiles every kernel with numba first (tier 0 is off: "
              "SIMACCEL_TIER0=0 or SIMACCEL_COMPILE_WORKERS < 2); warm loads their machine "
              "code from the cache (as the runs below do)\n")


def run_demo(trace_path: str, steps: int = 12) -> int:
    """Print the demo on stdout and write the trace; 0 if every run generated eager's tokens.

    The first calls run in child processes on a private temporary kernel cache; this
    process then uses that (warm) cache too, so the demo leaves nothing in the user's.
    """
    if steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps}")
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)  # the recompile warnings
    logging.getLogger("simaccel").setLevel(logging.ERROR)  # kept guards are in the report
    print(f"simaccel demo: TinyLM generates {steps} tokens; temperature and the global "
          f"LOGIT_SCALE change every step (dynamic=False, as static-shape hardware runs)\n")
    with tempfile.TemporaryDirectory(prefix="simaccel-demo-") as tmp:
        cache_dir = os.path.join(tmp, "kernels")
        _print_first_calls(cache_dir)
        with _kernel_cache(cache_dir):
            rows = _table(steps)
        _print_device(simaccel.get_device(), trace_path)
    ok = all(row.tokens == rows[0].tokens for row in rows)
    if not ok:
        print("error: a backend generated different tokens than plain eager PyTorch")
    return 0 if ok else 1


def _table(steps: int) -> list[Row]:
    """Run and print the three rows; the device stats are those of the simaccel run."""
    torch.manual_seed(0)
    model = TinyLM().eval()
    device = simaccel.get_device()
    rows = []
    for backend in ROW_LABELS:
        device.reset_stats()
        rows.append(_run(model, backend, steps))
    print(f"{'run':<21} {'graphs compiled':>15} {'recompiles':>11} {'time (s)':>9}  "
          f"tokens == plain eager")
    for row in rows:
        graphs = "-" if row.graphs is None else str(row.graphs)
        recompiles = "-" if row.graphs is None else str(max(row.graphs - 1, 0))
        same = "(reference)" if row is rows[0] else str(row.tokens == rows[0].tokens)
        print(f"{row.label:<21} {graphs:>15} {recompiles:>11} {row.seconds:>9.2f}  {same}")
    return rows


@contextlib.contextmanager
def _kernel_cache(cache_dir: str) -> Iterator[None]:
    """``SIMACCEL_CACHE_DIR=cache_dir`` while inside. The process-wide kernel cache reads it
    at its first compile: a process that compiled before keeps its own cache."""
    previous = os.environ.get("SIMACCEL_CACHE_DIR")
    os.environ["SIMACCEL_CACHE_DIR"] = cache_dir
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("SIMACCEL_CACHE_DIR", None)
        else:
            os.environ["SIMACCEL_CACHE_DIR"] = previous


def _print_device(device: simaccel.Device, trace_path: str) -> None:
    rt, dma, mem = device.runtime_stats(), device.dma_stats(), device.memory_stats()
    print("\nsimaccel device:")
    print(f"  kernels launched {rt['kernel_launches']}, host fallback ops {rt['host_fallback_ops']}, "
          f"kernels compiled {rt['kernels_compiled']}, loaded from disk cache "
          f"{rt['kernel_cache_hits']}")
    print(f"  DMA host->device {dma['h2d.bytes']} bytes in {dma['h2d.transfers']} transfers, "
          f"device->host {dma['d2h.bytes']} bytes, constant bank {dma['const.transfers']} "
          f"transfers ({dma['const.bytes']} bytes), simulated busy {dma['busy_ns'] / 1e3:.1f} us")
    print(f"  memory: peak allocated {mem['allocated_bytes.all.peak']} bytes, now "
          f"{mem['allocated_bytes.all.current']} bytes, reserved {mem['reserved_bytes.all.current']} bytes")
    device.export_trace(trace_path)
    print(f"  trace written to {trace_path} (open it in https://ui.perfetto.dev)")
    last = simaccel.reports()[-1] if simaccel.reports() else None
    if last is not None:
        print("\n" + last.summary())


if __name__ == "__main__":
    if sys.argv[1:] != [FIRST_CALL_FLAG]:
        sys.exit(f"usage: python -m simaccel.demo {FIRST_CALL_FLAG} (run by simaccel demo)")
    print(json.dumps(_first_call()))

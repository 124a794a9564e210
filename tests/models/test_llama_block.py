"""The Llama-style block (:mod:`llama_block`): grouped-query attention, rotary
embeddings, RMSNorm and SwiGLU in a generation loop over a growing key/value cache, each
step equal to eager; the attention runs as the device's fused kernel, and generation
makes no more graphs than Dynamo's eager backend. (Grouped-query attention's backward:
``tests/backend/test_fused_attention.py``.)"""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import simaccel
from llama_block import LlamaBlock, LlamaConfig
from simaccel.codegen.blas_symbols import has_gemm

#: float32 through two GEMM layers, an attention and two norms
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _attention_kernels(reports=None) -> list[str]:
    """Names of the fused attention kernels (templates, not library calls of eager's op)
    in the graphs compiled since the reports were cleared."""
    return [k.name for r in (reports or simaccel.reports()) for k in r.kernels
            if k.kind == "extern" and "flash_attention" in k.name]


def _generate(backend: str, steps: int = 6) -> list[torch.Tensor]:
    """A prompt, then one token at a time against the growing cache: every step's output
    and the last step's keys and values."""
    torch.manual_seed(0)
    model = LlamaBlock(LlamaConfig()).eval()
    step = torch.compile(model, backend=backend)
    outputs = []
    with torch.no_grad():
        out, past = step(torch.randn(2, 5, 64))
        outputs.append(out)
        for _ in range(steps):
            out, past = step(torch.randn(2, 1, 64), past)
            outputs.append(out)
    return outputs + list(past)


@pytest.mark.skipif(not has_gemm("float32"), reason="this torch exports no BLAS GEMM")
def test_generation_with_a_gqa_cache_equals_eager_in_no_more_graphs_than_dynamo():
    counters.clear()
    got = _generate("simaccel")
    reports = simaccel.reports()
    stats, moved = simaccel.get_device().runtime_stats(), simaccel.get_device().dma_stats()
    ours = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    counters.clear()
    want = _generate("eager")
    assert ours <= counters["stats"]["unique_graphs"]
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, **TOL)
    assert got[-1].shape == (2, 2, 11, 8)  # the cache keeps the fewer key/value heads
    assert stats["host_fallback_ops"] == 0 and stats["kernel_launches"] > 0
    assert moved["h2d.bytes"] + moved["h2d.mapped_bytes"] > 0
    # the prompt's causal graph and the decode steps' (a dynamic cache length) both
    # run the fused kernel
    assert len(_attention_kernels(reports)) == len(reports) >= 2

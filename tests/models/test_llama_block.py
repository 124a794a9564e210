"""The Llama-style block (:mod:`llama_block`): grouped-query attention, rotary
embeddings, RMSNorm and SwiGLU, a prompt's forward and backward and a generation loop
over a growing key/value cache, each equal to eager; the attention runs as the device's
fused kernel, and generation makes no more graphs than Dynamo's eager backend."""
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


@pytest.mark.skipif(not has_gemm("float32"), reason="this torch exports no BLAS GEMM")
def test_prompt_forward_and_backward_equal_eager_with_the_fused_gqa_kernel():
    torch.manual_seed(0)
    model = LlamaBlock(LlamaConfig())
    reference = LlamaBlock(LlamaConfig())
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 24, 64)
    out, (k, v) = torch.compile(model, backend="simaccel")(x)
    want, (k_ref, v_ref) = reference(x)
    for got, expected in ((out, want), (k, k_ref), (v, v_ref)):
        torch.testing.assert_close(got, expected, **TOL)
    assert k.shape == (2, 2, 24, 8)  # the cache keeps the fewer key/value heads
    out.square().sum().backward()
    want.square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)
    assert _attention_kernels(), "the fused attention kernel did not run"
    stats = simaccel.get_device().runtime_stats()
    assert stats["host_fallback_ops"] == 0 and stats["kernel_launches"] > 0
    assert simaccel.get_device().dma_stats()["h2d.bytes"] > 0


def _generate(backend: str, steps: int = 6) -> list[torch.Tensor]:
    """A prompt, then one token at a time against the growing cache: every step's output."""
    torch.manual_seed(0)
    model = LlamaBlock(LlamaConfig()).eval()
    step = torch.compile(model, backend=backend)
    outputs = []
    with torch.no_grad():
        out, past = step(torch.randn(1, 5, 64))
        outputs.append(out)
        for _ in range(steps):
            out, past = step(torch.randn(1, 1, 64), past)
            outputs.append(out)
    return outputs


@pytest.mark.skipif(not has_gemm("float32"), reason="this torch exports no BLAS GEMM")
def test_generation_with_a_gqa_cache_equals_eager_in_no_more_graphs_than_dynamo():
    counters.clear()
    got = _generate("simaccel")
    reports = simaccel.reports()
    ours = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    counters.clear()
    want = _generate("eager")
    assert ours <= counters["stats"]["unique_graphs"]
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, **TOL)
    assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 0
    # the prompt's causal graph and the decode steps' (a dynamic cache length) both
    # run the fused kernel
    assert len(_attention_kernels(reports)) == len(reports) >= 2

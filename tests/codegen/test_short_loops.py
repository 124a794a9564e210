"""Short static inner loops are merged with the loops around them
(:data:`simaccel.codegen.emit.SHORT_LOOP`): LLVM runs a loop shorter than its vector
width times its interleave scalar. The merged loop recovers each index by ``//`` and
``%``; these tests pin which loops merge and that merged kernels equal eager."""
from __future__ import annotations

import pathlib

import torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from simaccel.codegen.emit import SHORT_LOOP, loop_nest
from tests.conftest import REDUCTION_TOL, check


def test_a_short_innermost_loop_merges_with_the_fewest_loops_reaching_the_bound():
    lines, indent = loop_nest(["i0", "i1", "i2"], (8, 64, 32), False, "    ")
    assert lines == ["    for i0 in range(8):",
                     "        for i1_tail in range(2048):",
                     "            i1 = i1_tail // 32",
                     "            i2 = (i1_tail) % 32"]
    assert indent == "            "


def test_long_or_symbolic_inner_loops_stay_as_they_are():
    lines, _ = loop_nest(["i0", "i1"], (8, SHORT_LOOP), True, "")
    assert lines == ["for i0 in prange(8):", "    for i1 in range(64):"]
    u0 = ShapeEnv().create_unbacked_symint()
    lines, _ = loop_nest(["i0", "i1"], (4, u0), False, "")
    assert lines == ["for i0 in range(4):", f"    for i1 in range({u0}):"]
    lines, _ = loop_nest(["i0"], (8,), False, "")
    assert lines == ["for i0 in range(8):"]


def test_a_nest_merged_whole_keeps_its_prange():
    lines, _ = loop_nest(["i0", "i1"], (4, 8), True, "")
    assert lines[0] == "for i0_tail in prange(32):"


def _sources(result, kind: str) -> list[str]:
    return [pathlib.Path(k.path).read_text() for r in result.reports for k in r.kernels
            if k.kind == kind]


def test_a_split_heads_transpose_runs_merged_and_equals_eager():
    """GPT-2's q/k/v: bias added to a (batch, tokens, 3 * width) GEMM result, split and
    moved to (batch, heads, tokens, head_dim) with head_dim 32."""
    torch.manual_seed(0)
    x, w, bias = torch.randn(2, 64, 128), torch.randn(384, 128), torch.randn(384)

    def split_heads(x, w, bias):
        q, k, v = torch.nn.functional.linear(x, w, bias).split(128, dim=2)
        return tuple(z.view(2, 64, 4, 32).transpose(1, 2).contiguous() for z in (q, k, v))
    result = check(split_heads, x, w, bias, rtol=1e-5, atol=1e-4)
    merged = [s for s in _sources(result, "pointwise") if "_tail in range(2048)" in s]
    assert merged, _sources(result, "pointwise")


def test_a_reduction_over_short_trailing_dims_runs_merged_and_equals_eager():
    x = torch.randn(16, 8, 6, 5)
    result = check(lambda x: x.sum((2, 3)) + x.amax((2, 3)), x, **REDUCTION_TOL)
    assert any("_tail in range(30)" in s for s in _sources(result, "reduction")) or any(
        "_tail in range(30)" in s for s in _sources(result, "row"))

"""Loop-invariant code motion (:mod:`simaccel.codegen.hoist`): which kernel statements
move before the loops, and that kernels with moved statements equal eager."""
from __future__ import annotations

import pathlib

import pytest
import torch

from simaccel.codegen.hoist import hoist_invariants, hoist_out_of_loops
from tests.conftest import check

BODY = [
    "    for i0 in range(64):",
    "        t0 = x[np.uint64(i0)]",
    "        t1 = bank[np.uint64(0)]",
    "        t2 = np.float32(np.float64(t1))",
    "        t3 = np.float32((t0 * t2))",
    "        out[np.uint64(i0)] = t3",
]


def test_a_constant_position_load_and_its_conversions_move_before_the_loops():
    assert hoist_invariants(BODY, ["out", "x", "bank"]) == [
        "    t1 = bank[np.uint64(0)]",
        "    t2 = np.float32(np.float64(t1))",
        "    for i0 in range(64):",
        "        t0 = x[np.uint64(i0)]",
        "        t3 = np.float32((t0 * t2))",
        "        out[np.uint64(i0)] = t3",
    ]


def test_a_buffer_the_kernel_stores_into_is_read_in_the_loop():
    body = BODY[:-1] + ["        bank[np.uint64(0)] = t3"]
    assert hoist_invariants(body, ["out", "x", "bank"]) == body


def test_nothing_moves_out_of_a_loop_that_may_not_run():
    for header in ("    for i0 in range(s0):", "    for i0 in range(0):", "    if flag:"):
        body = [header] + BODY[1:]
        assert hoist_invariants(body, ["out", "x", "bank"]) == body, header


def test_a_name_bound_twice_stays_where_it_is():
    body = BODY + ["    if wide_args:", "        t1 = bank[np.uint64(0)]"]
    assert hoist_invariants(body, ["out", "x", "bank"]) == body


def test_an_unknown_function_is_not_taken_for_pure():
    body = BODY[:3] + ["        t2 = side_effect(t1)"] + BODY[4:]
    assert hoist_invariants(body, ["out", "x", "bank"])[:2] == [
        "    t1 = bank[np.uint64(0)]", "    for i0 in range(64):"]


def test_a_kernel_scaling_by_a_0d_input_reads_it_once_and_equals_eager():
    x, scale = torch.randn(32, 48), torch.tensor(0.37)
    result = check(lambda x, s: torch.softmax(x * s, -1) + x * s, x, scale,
                   rtol=1e-4, atol=1e-5)
    sources = [pathlib.Path(k.path).read_text() for r in result.reports for k in r.kernels]
    moved = [s for s in sources if _before_first_loop(s, "[np.uint64(0)]")]
    assert moved, sources


def _before_first_loop(source: str, text: str) -> bool:
    body = source.split("def kernel(", 1)[1]
    return text in body.split("    for ", 1)[0]


ROWS = [
    "    for i0 in prange(8):",
    "        for i1 in range(16):",
    "            t0 = x[np.uint64(i0*16 + i1)]",
    "            t1 = m[np.uint64(i0)]",
    "            t2 = bool(0 <= (i0 - 4) < 4)",
    "            t3 = np.float32((t1 if t2 else np.float32(-np.inf)))",
    "            t4 = np.float32(lib.vexp((t0 - t3)))",
    "            out[np.uint64(i0*16 + i1)] = t4",
]


def test_a_per_row_value_moves_out_of_the_column_loop_only():
    """The row's load and what depends on it alone leave the inner loop; nothing
    reading the column index does, and nothing leaves the row loop (it reads i0)."""
    assert hoist_out_of_loops(ROWS, ["out", "x", "m"]) == [
        "    for i0 in prange(8):",
        "        t1 = m[np.uint64(i0)]",
        "        t2 = bool(0 <= (i0 - 4) < 4)",
        "        t3 = np.float32((t1 if t2 else np.float32(-np.inf)))",
        "        for i1 in range(16):",
        "            t0 = x[np.uint64(i0*16 + i1)]",
        "            t4 = np.float32(lib.vexp((t0 - t3)))",
        "            out[np.uint64(i0*16 + i1)] = t4",
    ]


def test_nothing_leaves_a_column_loop_that_may_not_run_or_stores_what_it_reads():
    dynamic = ROWS[:1] + ["        for i1 in range(s0):"] + ROWS[2:]
    assert hoist_out_of_loops(dynamic, ["out", "x", "m"]) == dynamic
    stores_m = ROWS[:-1] + ["            m[np.uint64(i0)] = t4"]
    moved = hoist_out_of_loops(stores_m, ["out", "x", "m"])
    assert moved.index("            t1 = m[np.uint64(i0)]") > moved.index(ROWS[1])


@pytest.mark.usefixtures("without_fused_attention")
def test_causal_attention_combining_kernel_reads_each_row_once_and_equals_eager():
    """The kernel combining the two key halves (simaccel.attention._causal_halves, where
    the torch exports no BLAS GEMM for the fused kernel): the rows' maxima and sums are
    loaded before the loop over the head dimension."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 64) for _ in range(3))  # 64: a loop of its own
    result = check(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True), q, k, v, rtol=1e-4, atol=1e-5)
    combine = [kern for r in result.reports for kern in r.kernels if kern.kind == "pointwise"]
    source = pathlib.Path(combine[-1].path).read_text().splitlines()
    inner = next(n for n, line in enumerate(source) if "for i3 in range(64):" in line)
    assert not any("lib.vexp" in line for line in source[inner:])  # per row, not per element

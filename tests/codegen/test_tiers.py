"""Tier-0 kernels (the whole-array numpy form, :mod:`simaccel.codegen.emit_numpy`) compute
what the compiled kernels compute.

Op tables of ``tests/backend/test_ops.py`` (one per kernel kind: unary, binary, integer,
select, casts, reductions with NaN, integer reductions, norms, indexing, constants) are
compiled twice: with ``tier0="only"`` (every kernel that has a tier-0 form runs it,
nothing is compiled for it) and with ``tier0=False`` (compiled kernels only). Pointwise results must be equal (``torch.equal``
with NaN where NaN; -0.0 equals 0.0); float sums may differ by the association of their
accumulation (numpy's pairwise sum vs the compiled loop's vector lanes): at most a few
ulp, rtol 1e-6 / atol 1e-7 (float32) or 1e-13 (float64). Both equal eager (as in
test_ops).
"""
from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten

import simaccel
from simaccel import get_device
from tests.backend import test_ops as ops

#: float32 ops the compiled kernels call libm for, on two operands
LIBM_OPS = {
    "log1p": lambda x, y: torch.log1p(x), "expm1": lambda x, y: torch.expm1(x),
    "tan": lambda x, y: torch.tan(x), "asin": lambda x, y: torch.asin(x.clamp(-1, 1)),
    "atan": lambda x, y: torch.atan(x), "sinh": lambda x, y: torch.sinh(x),
    "log2": lambda x, y: torch.log2(y), "log10": lambda x, y: torch.log10(y),
    "exp2": lambda x, y: torch.exp2(x), "atan2": torch.atan2,
    "pow": lambda x, y: torch.pow(y, x), "pow_scalar": lambda x, y: torch.pow(y, 1.7),
}

#: name -> (table, inputs factory, view, outputs whose float accumulation may differ)
CASES: dict[str, tuple[dict, Any, Any, tuple[str, ...]]] = {
    "unary_f32": (ops.UNARY, lambda: (ops.specials(10, 12),), lambda x: x.t()[::2, 1:9], ()),
    # float64 exp/log/tanh/erf and every float32 op below leave their rounding to libm
    # (numpy's own SIMD versions differ on AVX-512): tier 0 calls libm per element
    "unary_f64": (ops.UNARY, lambda: (ops.specials(10, 12, dtype=torch.float64),),
                  lambda x: x.t()[::2, 1:9], ()),
    "libm_f32": (LIBM_OPS, lambda: (ops.specials(6, 8), ops.specials(8, seed=3).abs()), None,
                 ()),
    "libm_f32_wide_trig": ({"sin": lambda x, s: torch.sin(x * s), "cos": lambda x, s:
                            torch.cos(x * s)},
                           lambda: (ops.specials(6, 8), torch.full((8,), 3.0e4)), None, ()),
    "binary_f32": (ops.BINARY, lambda: (ops.specials(6, 8), ops.specials(8, seed=3)), None,
                   ()),
    "binary_int": (ops.BINARY_INT, lambda: (ops.randint(6, 8), ops.randint(8, seed=3,
                                                                           nonzero=True)),
                   None, ()),
    "select": (ops.SELECT, lambda: (ops.specials(6, 8), ops.specials(8, seed=1),
                                    ops.randn(6, 1, seed=2) > 0), None, ()),
    "casts": (ops.CASTS, lambda: (ops.specials(8, 6), ops.randint(8, 6), ops.randn(8, 6) > 0),
              lambda x, i, b: (x.t(), i.t(), b.t()), ()),
    "reductions_nan": ({n: ops.REDUCTIONS[n] for n in ops.NAN_REDUCTIONS},
                       lambda: (ops.specials(4, 5, 6),), None, ("*",)),
    "reductions_int": (ops.REDUCTIONS_INT, lambda: (ops.randint(6, 5, 4),),
                       lambda x: x.transpose(0, 2), ()),
    "norms": (ops.NORMS, lambda: (ops.randn(4, 6, 8) * 3 + 1, ops.randn(8, seed=1),
                                  ops.randn(8, seed=2), ops.randn(6, seed=3),
                                  ops.randn(6, seed=4).abs() + 0.5), None, ("*",)),
    # row kernels (softmax: max, sum of exp, weights per row), stage by stage in tier 0;
    # not log_softmax: x - max - log(sum) cancels to values near 0 whose absolute error is
    # an ulp of log(sum) (2.4e-7), past this test's atol for reordered sums
    "softmax": ({n: ops.SOFTMAX[n] for n in ("softmax_last", "softmax_d0", "softmax_f64")},
                lambda: (ops.randn(3, 4, 7) * 4,), None, ("*",)),
    "indexing": (ops.INDEXING, lambda: (ops.randn(10, 4), ops.randint(2, 5, low=0, high=10,
                                                                      dtype=torch.int64),
                                        torch.tensor([3, 0, 1, 3])), None, ()),
    "constants": (ops.CONSTANTS, lambda: (ops.randn(6, 8),), None, ()),
    # loads guarded by chained bounds (``0 <= i - 2 < 8``): an ``and`` arrays cannot take
    "padding": ({"pad_last": lambda x: F.pad(x, (2, 3), value=-1.5),
                 "pad_rows": lambda x: F.pad(x, (0, 0, 1, 2)),
                 "cat": lambda x: torch.cat([x, x * 2.0], 1)},
                lambda: (ops.randn(6, 8),), None, ()),
}


#: cases whose graphs include row kernels (:mod:`simaccel.codegen.fusion_rows`)
ROW_CASES = ("softmax", "norms")


def _run(fn, args, tier0: Any) -> tuple[dict, dict]:
    torch._dynamo.reset()
    simaccel.clear_reports()
    get_device().reset_stats()
    compiled = torch.compile(fn, backend="simaccel", dynamic=False,
                             options={"tier0": tier0})
    out = compiled(*[a.clone() for a in args])
    return out, get_device().runtime_stats()


def _tolerant(name: str, key: str) -> bool:
    loose = CASES[name][3]
    return "*" in loose or key in loose


@pytest.mark.parametrize("name", list(CASES))
def test_tier0_equals_compiled(name: str) -> None:
    table, make, view, _ = CASES[name]
    fn = ops.table_fn(table, view)
    args = make()
    tier0, stats0 = _run(fn, args, "only")
    compiled, stats1 = _run(fn, args, False)
    assert stats0["tier0_launches"] > 0 and stats0["kernels_compiled"] + \
        stats0["kernel_cache_hits"] + stats0["kernel_memory_hits"] < stats1["kernel_launches"]
    assert stats1.get("tier0_launches", 0) == 0
    assert stats0["kernel_launches"] == stats1["kernel_launches"]
    if name in ROW_CASES:
        assert "row" in {k.kind for r in simaccel.reports() for k in r.kernels}
    for key, actual, expected in _leaves(tier0, compiled):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, key
        if expected.is_floating_point() and _tolerant(name, key):
            f64 = expected.dtype == torch.float64
            torch.testing.assert_close(actual, expected, equal_nan=True,
                                       rtol=1e-13 if f64 else 1e-6,
                                       atol=1e-13 if f64 else 1e-7,
                                       msg=lambda m, k=key: f"{k}: {m}")
        else:
            same = torch.equal(actual, expected) or (
                expected.is_floating_point()
                and torch.equal(actual.isnan(), expected.isnan())
                and torch.equal(actual.nan_to_num(0.0), expected.nan_to_num(0.0)))
            assert same, f"{name}/{key}: tier-0 {actual} != compiled {expected}"
    eager = fn(*[a.clone() for a in args])
    for key, actual, expected in _leaves(tier0, eager):
        torch.testing.assert_close(actual, expected, equal_nan=True, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, k=key: f"{k} vs eager: {m}")


def _leaves(actual: dict, expected: dict) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(op name, actual tensor, expected tensor) for every tensor both results hold."""
    found = []
    for key in expected:
        got, _ = tree_flatten(actual[key])
        want, _ = tree_flatten(expected[key])
        assert len(got) == len(want), key
        found += [(key, a, e) for a, e in zip(got, want)]
    return found


def test_kernels_start_in_tier0_and_switch_when_the_workers_are_done(monkeypatch):
    """With compile workers, a graph's new kernels launch as numpy at once, and from the
    first launch after their worker finished as compiled kernels (command lists and all),
    with the same results; the report says which tier each kernel started in."""
    monkeypatch.setenv("SIMACCEL_COMPILE_WORKERS", "2")
    scale = float(np.random.default_rng().integers(1 << 20)) + 0.25  # new kernel sources

    def fn(x, y):
        a = (x * scale).sin().sum(-1)
        b = torch.softmax((x @ y) * scale, -1)
        return a, b, (y - scale).exp()

    simaccel.clear_reports()
    device = get_device()
    device.reset_stats()
    x, y = torch.randn(16, 8), torch.randn(8, 4)
    compiled = torch.compile(fn, backend="simaccel", dynamic=False,
                             options={"lift": "off", "tier0": True})
    first = compiled(x, y)
    stats = device.runtime_stats()
    kernels = [k for r in simaccel.reports() for k in r.kernels if k.kind != "library"]
    assert kernels and all(k.origin == "tier0" for k in kernels), kernels
    assert stats["tier0_kernels"] == len(kernels) and stats["kernels_compiled"] == 0
    assert stats["tier0_launches"] > 0 and "tier0" in str(simaccel.reports()[-1])
    simaccel.wait_for_kernels()
    launches = device.runtime_stats()["tier0_launches"]
    for _ in range(4):
        again = compiled(x, y)
    stats = device.runtime_stats()
    assert stats["tier0_launches"] == launches  # every launch now runs compiled code
    # the report started "(compiling in the background)"; it now names each kernel's file
    assert all(pathlib.Path(k.path).read_text().startswith("# kernel helpers")
               for k in kernels), [k.path for k in kernels]
    assert stats["kernels_compiled"] == len(kernels) and stats.get("tier0_waits", 0) == 0
    # the first call's float32 sums (tier 0: numpy's pairwise order) may differ from the
    # compiled loop's by their association: the pointwise contract's tolerance
    for got, want, ref in zip(first, again, fn(x, y)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_a_tier0_form_that_fails_waits_for_its_compiled_kernel(caplog):
    """The fallback path: a launch whose tier-0 form raises waits for the compile in flight
    (counted in ``tier0_waits``, logged at INFO) and runs the compiled kernel, which every
    later launch uses; the tier epoch moves so that programs bind it."""
    import concurrent.futures
    import logging
    import threading

    from simaccel.codegen.tiered import TieredKernel
    from simaccel.runtime import tiers

    def broken_tier0(out, x):
        raise FloatingPointError("tier-0 form failed")

    def compiled(out, x):
        np.add(x, 1.0, out=out)

    pending: concurrent.futures.Future = concurrent.futures.Future()
    threading.Timer(0.05, pending.set_result, (None,)).start()  # the worker finishing
    device = get_device()
    before = device.runtime_stats()
    epoch = tiers.current()
    kernel = TieredKernel("k_test", broken_tier0, pending, lambda: compiled, device)
    out, x = np.zeros(4, np.float32), np.arange(4, dtype=np.float32)
    with caplog.at_level(logging.INFO, logger="simaccel"):
        kernel(out, x)
    np.testing.assert_array_equal(out, x + 1)
    after = device.runtime_stats()
    assert after.get("tier0_waits", 0) - before.get("tier0_waits", 0) == 1
    assert after.get("tier0_launches", 0) == before.get("tier0_launches", 0)
    assert kernel.ready() and tiers.current() != epoch
    assert any("tier-0 form of kernel k_test failed" in r.getMessage() for r in caplog.records)
    kernel(out, out)  # later launches run the compiled kernel
    np.testing.assert_array_equal(out, x + 2)


def test_a_libm_op_beyond_its_element_limit_waits_for_the_compiled_kernel(monkeypatch):
    """Tier 0 calls libm per element up to numpy_lib.LIBM_ELEMENTS; past it the launch
    waits for the compiled kernel (counted in tier0_waits) and the result is the same."""
    from simaccel.codegen import numpy_lib
    monkeypatch.setattr(numpy_lib, "LIBM_ELEMENTS", 16)
    x = ops.specials(8, 8)
    out, stats = _run(torch.log1p, (x,), "only")
    assert stats["tier0_waits"] == 1 and stats.get("tier0_launches", 0) == 0
    assert stats["kernels_compiled"] + stats["kernel_cache_hits"] \
        + stats["kernel_memory_hits"] == 1
    expected, _ = _run(torch.log1p, (x,), False)
    assert torch.equal(out.nan_to_num(0.0), expected.nan_to_num(0.0))
    assert torch.equal(out.isnan(), expected.isnan())

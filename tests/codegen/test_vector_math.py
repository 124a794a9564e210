"""The vectorisable float32 sin/cos/log of the kernel library: accuracy against torch
and a float64 reference (sin/cos over their fast range), the special values (NaN, +-inf,
-0.0, subnormals), the flag for arguments outside sin/cos' fast range, that a loop using
them has no libm call and vectorises, and that kernels meeting huge arguments still
equal eager (they recompute themselves with libm)."""
from __future__ import annotations

import pathlib
import re

import numba
import numpy as np
import pytest
import torch

from simaccel.codegen import kernel_lib as lib
from simaccel.codegen.emit import PARALLEL_THRESHOLD, RANGE_FLAG
from tests.conftest import POINTWISE_TOL, check

LIMIT = np.float32(lib.TRIG_FAST_LIMIT)
#: the helpers' error bound in units in the last place of a float64 reference (SLEEF's
#: u35 functions: 3.5 ulp), or this absolute error where the result is tiny (near a
#: multiple of pi the reduction's absolute error dominates).
MAX_ULP, TINY_ABS = 3.5, 2.0 ** -30


@numba.njit(error_model="numpy")
def _apply(name_is_sin: bool, x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = lib.vsin(x[i]) if name_is_sin else lib.vcos(x[i])
    return out


@numba.njit(error_model="numpy")
def _flags(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape[0], np.int64)
    for i in range(x.shape[0]):
        out[i] = lib.trig_arg_wide(x[i])
    return out


def _fast_range_samples() -> np.ndarray:
    """Uniform samples at every scale up to the fast range's end, both signs."""
    rng = np.random.default_rng(0)
    parts = [rng.uniform(-hi, hi, 200_000) for hi in (1.0, 4.0, 100.0, 3000.0, float(LIMIT))]
    parts.append(np.linspace(-LIMIT, LIMIT, 400_001, endpoint=False))
    parts.append(np.arange(-2000, 2000) * np.pi)  # next to multiples of pi: tiny results
    x = np.concatenate(parts).astype(np.float32)
    return x[np.abs(x) < LIMIT]


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_fast_range_accuracy(name: str) -> None:
    x = _fast_range_samples()
    got = _apply(name == "sin", x)
    want = getattr(torch, name)(torch.from_numpy(x))
    torch.testing.assert_close(torch.from_numpy(got), want, **POINTWISE_TOL)
    exact = getattr(np, name)(x.astype(np.float64))
    err = np.abs(got.astype(np.float64) - exact)
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    bad = (err > MAX_ULP * ulp) & (err > TINY_ABS)
    assert not bad.any(), f"{name} off by {err[bad][:5]} at {x[bad][:5]}"
    assert not _flags(x).any()


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-40, -1.1754942e-38,
                     1e-20, -3e-5], np.float32)


@numba.njit(error_model="numpy")
def _unary(is_log: bool, x: np.ndarray) -> np.ndarray:
    """lib.vlog (``is_log``) or lib.vexp of every element."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = lib.vlog(x[i]) if is_log else lib.vexp(x[i])
    return out


def _log(x: np.ndarray) -> np.ndarray:
    return _unary(True, x)


def _run(name: str, x: np.ndarray) -> np.ndarray:
    return _log(x) if name == "log" else _apply(name == "sin", x)


def test_log_accuracy_over_all_scales() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(0, 10, 300_000), np.geomspace(1e-45, 3.4e38, 300_000),
                        np.linspace(0.5, 2, 100_001)]).astype(np.float32)
    x = x[x > 0]
    got = _log(x)
    torch.testing.assert_close(torch.from_numpy(got), torch.log(torch.from_numpy(x)),
                               **POINTWISE_TOL)
    exact = np.log(x.astype(np.float64))
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert (np.abs(got - exact) <= 1.0 * ulp).all()


@pytest.mark.parametrize("name", ["sin", "cos", "log"])
def test_special_values_match_torch(name: str) -> None:
    specials = np.concatenate([SPECIALS, np.float32([-1.0, 1.0, 2.0, 1000.0])])
    got = torch.from_numpy(_run(name, specials))
    want = getattr(torch, name)(torch.from_numpy(specials))
    torch.testing.assert_close(got, want, **POINTWISE_TOL, equal_nan=True)  # infs exactly
    if name != "log":  # sin(x) is x and cos(x) is 1 exactly for zeros and subnormals
        tiny = torch.from_numpy(np.abs(specials) < 1e-30)
        torch.testing.assert_close(got[tiny], want[tiny], rtol=0, atol=0)
    number = ~torch.isnan(want)  # a NaN's sign bit is not part of the contract
    assert torch.equal(torch.signbit(got[number]), torch.signbit(want[number]))  # sin(-0.0)


def test_arguments_outside_the_fast_range_are_flagged() -> None:
    x = np.array([LIMIT, -LIMIT, 1e5, -1e30, 3.4e38, np.nextafter(LIMIT, np.float32(0)),
                  np.nan, np.inf, -np.inf, 0.0], np.float32)
    assert _flags(x).tolist() == [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]


@numba.njit(error_model="numpy")
def _math_loop(out: np.ndarray, x: np.ndarray) -> None:
    for i in range(x.shape[0]):
        out[i] = lib.vsin(x[i]) + lib.vcos(x[i]) + lib.vlog(x[i])


def test_a_loop_of_the_helpers_vectorises_without_libm() -> None:
    x = np.linspace(0.5, 10, 64).astype(np.float32)
    out = np.empty_like(x)
    _math_loop(out, x)
    np.testing.assert_allclose(out, np.sin(x) + np.cos(x) + np.log(x), rtol=1e-5, atol=1e-6)
    llvm = _math_loop.inspect_llvm(_math_loop.signatures[0])
    assert not re.search(r"call .*@(llvm\.(sin|cos|log)\.|sinf|cosf|logf)", llvm)
    assert re.search(r"fmul <\d+ x float>", llvm), "the loop did not vectorise"


def _wide_input(numel: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(numel, generator=gen) * 10
    huge = torch.tensor([39000.0, -1e5, 1e10, -3.4e38, 123456.7, float("inf"), float("nan"),
                         -0.0, 1e-40])
    x[::457][:len(huge)] = huge
    return x


@pytest.mark.parametrize("numel", [4096, PARALLEL_THRESHOLD])  # serial and prange loops
def test_kernels_with_huge_arguments_equal_eager(numel: int) -> None:
    """A huge argument sends the kernel through its exact (libm) rerun."""
    x = _wide_input(numel)
    result = check(lambda x: (x.sin(), (x * 3.0).cos() + 1.0), x)
    sources = [pathlib.Path(k.path).read_text() for r in result.reports for k in r.kernels]
    assert all("lib.vsin" in s or "lib.vcos" in s for s in sources)
    assert all("np.sin" in s or "np.cos" in s for s in sources)  # the exact rerun
    want = torch.sin(x)
    number = ~torch.isnan(want)
    assert torch.equal(torch.signbit(result.outputs[0][number]), torch.signbit(want[number]))


def test_kernels_in_the_fast_range_equal_eager() -> None:
    """Also a prange kernel with two range-checked helpers: numba accepts its count of
    wide arguments only as one reduction update per iteration."""
    x = torch.linspace(-1000.0, 1000.0, 100_003)
    result = check(lambda x: (x.sin() * x.cos(), (x * 0.5 + 1.0).sin().sum()), x,
                   rtol=1e-4, atol=1e-4)
    sources = [pathlib.Path(k.path).read_text() for r in result.reports for k in r.kernels]
    both = [s for s in sources if "lib.vsin" in s and "lib.vcos" in s]
    assert both and "parallel=True" in both[0], sources
    assert both[0].count(f"{RANGE_FLAG} +=") == 1


def test_float64_sin_keeps_libm() -> None:
    x = torch.linspace(-1e6, 1e6, 1001, dtype=torch.float64)
    result = check(torch.sin, x)
    source = pathlib.Path(result.reports[0].kernels[0].path).read_text()
    assert "lib.vsin" not in source


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_float_sin_cos_use_the_fast_helpers(dtype: torch.dtype) -> None:
    """16-bit floats compute as float32 in kernels, so they take the vectorisable helper
    too (a bfloat16 chain with sin ran 8x slower on libm), huge arguments included:
    tolerance of one 16-bit rounding step (2**-8 relative for bfloat16)."""
    x = _wide_input(4096).to(dtype)  # eager rounds between ops, kernels once at the store
    result = check(lambda x: (x.sin(), x.cos() + 1.0), x, rtol=1e-2, atol=1e-2)
    sources = [pathlib.Path(k.path).read_text() for r in result.reports for k in r.kernels]
    assert all("lib.vsin" in s or "lib.vcos" in s for s in sources)
    assert all("np.sin" in s or "np.cos" in s for s in sources)  # the exact rerun


def test_exp_is_within_an_ulp_and_underflows_to_exactly_zero() -> None:
    """exp over its whole range, the underflow end included: a masked score
    (finfo.min, -inf) gives 0 exactly, by the helper's early select rather than by
    scaling into denormals; tier 0's numpy form (:mod:`simaccel.codegen.numpy_lib`) gives
    the same bits."""
    from simaccel.codegen import numpy_lib
    edge = np.float32(-104.0)
    x = np.concatenate([
        np.linspace(-120, 90, 1_000_001, dtype=np.float32),
        np.float32([-np.inf, np.inf, np.nan, np.finfo(np.float32).min, edge,
                    np.nextafter(edge, np.float32(0)), np.nextafter(edge, np.float32(-1e9)),
                    -103.97, -103.28, -87.5, 88.72, 88.73, 0.0, -0.0])])
    got = _unary(False, x)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf lanes, selected away
        assert np.array_equal(got, numpy_lib.vexp(x), equal_nan=True)
    with np.errstate(over="ignore"):
        exact = np.exp(x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(x))
    number = ~np.isnan(x)
    ulps = np.abs(got[number].view(np.int32).astype(np.int64)
                  - exact[number].view(np.int32).astype(np.int64))
    assert ulps.max() <= 1
    assert (got[x < edge] == 0).all() and not np.signbit(got[x < edge]).any()

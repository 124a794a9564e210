"""Lifted scalars as ATen's Python-number arguments (``alpha=``, clamp bounds, ``pow``
exponents, fill values, ``where``/``lerp`` scalars, ``addcmul``'s ``value``): read from
the constant bank on the device, passed as the call's Python number to a host fallback.
One graph for every value, results equal to eager."""
from __future__ import annotations

import math

import pytest
import torch

import simaccel
from optim_steps import unique_graphs

TOL = {"rtol": 1e-5, "atol": 1e-6}


def _compare(fn, make_args, values, **tol) -> None:
    compiled = torch.compile(fn, backend="simaccel")
    for value in values:
        torch.manual_seed(0)
        args = make_args(value)
        torch.testing.assert_close(compiled(*args), fn(*args), equal_nan=True, **(tol or TOL))
    assert unique_graphs() == 1


DEVICE_CASES = {
    "add_alpha": (lambda x, y, a: x.add(y, alpha=a) * 2, lambda v: (torch.randn(8),
                                                                  torch.randn(8), v)),
    "clamp_bounds": (lambda x, lo: torch.clamp(x, min=lo, max=lo + 1.0),
                     lambda v: (torch.randn(8), v)),
    "full_fill": (lambda x, v: x + torch.full((8,), v), lambda v: (torch.randn(8), v)),
    "where_scalar": (lambda x, v: torch.where(x > 0, x, v), lambda v: (torch.randn(8), v)),
    "lerp_weight": (lambda a, b, w: torch.lerp(a, b, w), lambda v: (torch.randn(8),
                                                                   torch.randn(8), v)),
    "addcmul_value": (lambda a, b, c, v: a.clone().addcmul_(b, c, value=v),
                      lambda v: (torch.randn(8), torch.randn(8), torch.randn(8), v)),
}


@pytest.mark.parametrize("case", list(DEVICE_CASES))
def test_device_reads_the_scalar_from_the_constant_bank(case: str) -> None:
    fn, make_args = DEVICE_CASES[case]
    _compare(fn, make_args, (0.25, 0.75, -1.5))
    stats = simaccel.get_device().runtime_stats()
    assert stats["host_fallback_ops"] == 0 and stats["kernel_launches"] > 0, stats
    assert simaccel.reports()[-1].guards.lifted


def test_pow_exponent_takes_torch_special_cases_per_call() -> None:
    """torch's CPU pow computes x**2, x**0.5, x**-1 ... by other ops, which differ from C
    pow at the edges (pow(-inf, 0.5) is inf, sqrt(-inf) is NaN): chosen per call."""
    x = torch.tensor([-math.inf, -2.0, -0.0, 0.0, 0.5, 3.0, math.inf, math.nan])
    _compare(lambda x, p: x.pow(p) + 1, lambda p: (x.clone(), p),
             (2.0, 0.5, 3.0, 1.7, -1.0, -0.5, -2.0, 2.5))
    assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 0


#: ops that take a lifted scalar as a Python-number argument: (fn, args for a value,
#: whether the op runs on the host). The host ones have no device lowering; the others
#: ran on the host before simaccel lowered them (addmv, dist, float16 clamp) and stay here
#: to show the lowering reads the scalar from the constant bank.
SCALAR_ARGUMENT_CASES = {
    "addmv_beta": (lambda x, m, v, b: torch.addmv(x, m, v, beta=b) * 2,
                   lambda b: (torch.randn(4), torch.randn(4, 3), torch.randn(3), b), False),
    "dist_p": (lambda x, y, p: torch.dist(x, y, p=p) + 1,
               lambda p: (torch.randn(5), torch.randn(5), p), False),
    "clamp_float16": (lambda x, lo: torch.clamp(x, min=lo) * 2,
                      lambda lo: (torch.randn(8).half(), lo), False),
    "histc_min": (lambda x, lo: torch.histc(x, bins=4, min=lo, max=10.0),
                  lambda lo: (torch.randn(20), lo), True),
    "segment_reduce_initial": (
        lambda x, lengths, init: torch.segment_reduce(x, "max", lengths=lengths,
                                                      initial=init) * 2,
        lambda init: (torch.randn(6), torch.tensor([2, 0, 4]), init), True),
}


@pytest.mark.parametrize("case,kind", [(case, kind) for case in SCALAR_ARGUMENT_CASES
                                       for kind in ("float", "int")])
def test_lifted_scalar_arguments_equal_eager_on_host_and_device(case: str, kind: str) -> None:
    """Each op receives the lifted value: a host fallback as the call's Python number,
    never a 0-d tensor; a device kernel from the constant bank. One graph for every value.
    (Odd ints for ``dist``: its norm decomposes with a branch on ``p % 2``, a predicate
    guard.)"""
    fn, make_args, on_host = SCALAR_ARGUMENT_CASES[case]
    values = (0.5, 1.5, 2.5) if kind == "float" else (1, 3, 5)
    _compare(fn, make_args, values, rtol=1e-3, atol=1e-3)
    report = simaccel.reports()[-1]
    assert report.guards.lifted, str(report.guards)
    assert bool(report.host_fallbacks) == on_host, report.host_fallbacks
    stats = simaccel.get_device().runtime_stats()
    assert (stats["host_fallback_ops"] > 0) == on_host, stats
    assert on_host or stats["kernel_launches"] > 0, stats

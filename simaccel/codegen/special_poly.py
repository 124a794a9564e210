"""Orthogonal polynomials of degree n (an integer) at x: Chebyshev (T, U, V, W and their shifted forms), Hermite (physicists' H, probabilists' He), Laguerre, Legendre.

Ported from PyTorch's ``aten/src/ATen/native/Math.h`` (derived from the Cephes Math Library;
see the 3-Clause BSD notes there), evaluated in float64: a kernel rounds the result to its
output dtype once. Each function is ``numba.njit`` (called from the kernels; not inlined: some recurse)
and plain Python under ``NUMBA_DISABLE_JIT=1``.
"""
from __future__ import annotations

import math

import numba
import numpy as np

_jit = numba.njit(cache=True, error_model="numpy", fastmath=False)
#: degrees above this give NaN for Hermite polynomials (torch's limit for float32 inputs)
HERMITE_LIMIT = 128


@_jit
def _chebyshev_recurrence(c, q, n):
    """Degree ``n`` (>= 2) of a Chebyshev family by its recurrence ``r = c * q - p``,
    from 1 (degree 0) and ``q`` (degree 1); stops at a NaN, as torch's loop does."""
    p = 1.0
    r = q
    for _ in range(2, n + 1):
        if math.isnan(q):
            break
        r = c * q - p
        p = q
        q = r
    return r


@_jit
def chebyshev_polynomial_t(x, n):
    if n < 0:
        return 0.0
    if abs(x) == 1.0:
        if x > 0.0 or n % 2 == 0:
            return 1.0
        return -1.0
    if (n > 6) and (abs(x) < 1.0):
        return math.cos(n * math.acos(x))
    if n == 0:
        return 1.0
    if n == 1:
        return x
    return _chebyshev_recurrence((x + x), x, n)


@_jit
def chebyshev_polynomial_u(x, n):
    if n < 0:
        return 0.0
    if abs(x) == 1.0:
        if x > 0.0 or n % 2 == 0:
            return n + 1
        return -(n + 1)
    if (n > 8) and (abs(x) < 1.0):
        if math.sin(math.acos(x)) != 0.0:
            return math.sin((n + 1) * math.acos(x)) / math.sin(math.acos(x))
        return (n + 1) * math.cos((n + 1) * math.acos(x)) / x
    if n == 0:
        return 1.0
    if n == 1:
        return x + x
    return _chebyshev_recurrence((x + x), x + x, n)


@_jit
def chebyshev_polynomial_v(x, n):
    if n < 0:
        return 0.0
    if abs(x) == 1.0:
        if x > 0.0:
            return 1.0
        if n % 2 == 0:
            return n + n + 1
        return -(n + n + 1)
    if (n > 8) and (abs(x) < 1.0):
        if math.sin(math.acos(x) / 2.0) != 1.0:
            return math.cos((n + 0.5) * math.acos(x)) / math.cos(math.acos(x) / 2.0)
        if n % 2 == 0:
            return n + n + 1
        return -(n + n + 1)
    if n == 0:
        return 1.0
    if n == 1:
        return x + x - 1.0
    return _chebyshev_recurrence((x + x), x + x - 1.0, n)


@_jit
def chebyshev_polynomial_w(x, n):
    if n < 0:
        return 0.0
    if abs(x) == 1.0:
        if x > 0.0:
            return n + n + 1
        if n % 2 == 0:
            return 1.0
        return -1.0
    if (n > 8) and (abs(x) < 1.0):
        if math.cos(math.acos(x) / 2.0) != 1.0:
            return math.sin((n + 0.5) * math.acos(x)) / math.sin(math.acos(x) / 2.0)
        if x > 0.0:
            return n + n + 1
        if n % 2 == 0:
            return 1.0
        return -1.0
    if n == 0:
        return 1.0
    if n == 1:
        return x + x + 1.0
    return _chebyshev_recurrence((x + x), x + x + 1.0, n)


@_jit
def shifted_chebyshev_polynomial_t(x, n):
    if n < 0:
        return 0.0
    if x == 1.0:
        return 1.0
    if x == 0.0:
        if n % 2 == 0:
            return 1.0
        return -1.0
    if (n > 6) and (abs(x + x - 1.0) < 1.0):
        return math.cos(n * math.acos(x + x - 1.0))
    if n == 0:
        return 1.0
    if n == 1:
        return x + x - 1.0
    return _chebyshev_recurrence((x + x - 1.0 + (x + x - 1.0)), x + x - 1.0, n)


@_jit
def shifted_chebyshev_polynomial_u(x, n):
    if n < 0:
        return 0.0
    if x == 1.0:
        return n + 1
    if x == 0.0:
        if n % 2 == 0:
            return n + 1
        return -(n + 1)
    if (n > 6) and (abs(x + x - 1.0) < 1.0):
        if math.sin(math.acos(x + x - 1.0)) != 0.0:
            return math.sin((n + 1) * math.acos(x + x - 1.0)) / math.sin(math.acos(x + x - 1.0))
        return (n + 1) * math.cos((n + 1) * math.acos(x + x - 1.0)) / (x + x - 1.0)
    if n == 0:
        return 1.0
    if n == 1:
        return x + x - 1.0 + (x + x - 1.0)
    return _chebyshev_recurrence((x + x - 1.0 + (x + x - 1.0)), x + x - 1.0 + (x + x - 1.0), n)


@_jit
def shifted_chebyshev_polynomial_v(x, n):
    if n < 0:
        return 0.0
    if x == 1.0:
        return 1.0
    if x == 0.0:
        if n % 2 == 0:
            return (n + n + 1)
        return -(n + n + 1)
    if (n > 6) and (abs(x + x - 1.0) < 1.0):
        if math.sin(math.acos(x + x - 1.0) / 2.0) != 1.0:
            return math.cos((n + 0.5) * math.acos(x + x - 1.0)) / math.cos(math.acos(x + x - 1.0) / 2.0)
        if n % 2 == 0:
            return n + n + 1
        return -(n + n + 1)
    if n == 0:
        return 1.0
    if n == 1:
        return x + x - 1.0 + (x + x - 1.0) - 1.0
    return _chebyshev_recurrence((x + x - 1.0 + (x + x - 1.0)), x + x - 1.0 + (x + x - 1.0) - 1.0, n)


@_jit
def shifted_chebyshev_polynomial_w(x, n):
    if n < 0:
        return 0.0
    if x == 1.0:
        return n + n + 1
    if x == 0.0:
        if n % 2 == 0:
            return 1.0
        return -1.0
    if (n > 4) and (abs(x + x - 1.0) < 1.0):
        if math.cos(math.acos(x + x - 1.0) / 2.0) != 1.0:
            return math.sin((n + 0.5) * math.acos(x + x - 1.0)) / math.sin(math.acos(x + x - 1.0) / 2.0)
        if n % 2 == 0:
            return 1.0
        return -1.0
    if n == 0:
        return 1.0
    if n == 1:
        return x + x - 1.0 + (x + x - 1.0) + 1.0
    return _chebyshev_recurrence((x + x - 1.0 + (x + x - 1.0)), x + x - 1.0 + (x + x - 1.0) + 1.0, n)


@_jit
def hermite_polynomial_h(x, n):
    if n < 0:
        return 0.0
    if n == 0:
        return 1.0
    if n == 1:
        return x + x
    if n > HERMITE_LIMIT:
        return math.nan
    p = 1.0
    q = x + x
    r = 0.0
    for k in range(2, n + n, 2):
        r = (x + x) * q - k * p
        p = q
        q = r
    return r


@_jit
def hermite_polynomial_he(x, n):
    if n < 0:
        return 0.0
    if n == 0:
        return 1.0
    if n == 1:
        return x
    if n > HERMITE_LIMIT:
        return math.nan
    p = 1.0
    q = x
    r = q  # the value when the recurrence stops at once
    for k in range(1, n):
        r = x * q - k * p
        p = q
        q = r
    return r


@_jit
def laguerre_polynomial_l(x, n):
    if n < 0:
        return 0.0
    if abs(x) == 0.0:
        return 1.0
    if n == 0:
        return 1.0
    if n == 1:
        return 1.0 - x
    p = 1.0
    q = 1.0 - x
    r = q  # the value when the recurrence stops at once
    for k in range(1, n):
        if math.isnan(q):
            break
        r = (((k + k) + (1.0 - x)) * q - k * p) / (k + 1)
        p = q
        q = r
    return r


@_jit
def legendre_polynomial_p(x, n):
    if n < 0:
        return 0.0
    if abs(x) == 1.0:
        if x > 0.0 or n % 2 == 0:
            return 1.0
        return -1.0
    if n == 0:
        return 1.0
    if n == 1:
        return x
    p = 1.0
    q = x
    r = q  # the value when the recurrence stops at once
    for k in range(1, n):
        if math.isnan(q):
            break
        r = ((k + k + 1) * x * q - k * p) / (k + 1)
        p = q
        q = r
    return r


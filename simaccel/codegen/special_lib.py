"""Special functions for generated kernels: the gamma family (lgamma, digamma, trigamma,
polygamma, Hurwitz zeta), the error-function family (erfc, erfinv, erfcx, ndtri,
log_ndtr) and the exponentially scaled modified Bessel functions i0e, i1e.

Ported from PyTorch's ``aten/src/ATen/native/Math.h`` (Cephes-derived, see its 3-Clause
BSD notes) and evaluated in float64, so a float32 kernel rounds an accurate value once.
The Bessel functions and orthogonal polynomials live in :mod:`.special_bessel`,
:mod:`.special_modified` and :mod:`.special_poly`. Kernels call all of them as
``lib.<name>`` (re-exported by :mod:`.kernel_lib`); under ``NUMBA_DISABLE_JIT=1`` they
are plain Python.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from simaccel.codegen.special_modified import (_MODIFIED_BESSEL_I0_A, _MODIFIED_BESSEL_I0_B,
                                               _MODIFIED_BESSEL_I1_A, _MODIFIED_BESSEL_I1_B)

_jit = numba.njit(cache=True, error_model="numpy", fastmath=False)

_MACHEP = 1.11022302462515654042e-16
_ZETA_A = np.array([
    12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
    -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
    1.8152105401943546773e17, -7.1661652561756670113e18])
_DIGAMMA_A = np.array([
    8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
    -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
    8.33333333333333333333e-2])
_PSI_10 = 2.25175258906672110764


@_jit
def polevl(x, coeffs):
    """``coeffs[0]*x**n + ... + coeffs[n]`` (Horner)."""
    result = 0.0
    for c in coeffs:
        result = result * x + c
    return result


@_jit
def chbevl(x, coeffs):
    """Cephes' Chebyshev series evaluation."""
    b0 = coeffs[0]
    b1 = 0.0
    b2 = 0.0
    for i in range(1, coeffs.size):
        b2 = b1
        b1 = b0
        b0 = x * b1 - b2 + coeffs[i]
    return 0.5 * (b0 - b2)


@_jit
def lgamma(x):
    return math.lgamma(x) if not (x <= 0.0 and x == math.floor(x)) else math.inf


@_jit
def erfc(x):
    return math.erfc(x)


@_jit
def zeta(x, q):
    """Hurwitz zeta ``sum_k (k + q)**-x``."""
    if x == 1.0:
        return math.inf
    if x < 1.0:
        return math.nan
    if q <= 0.0:
        if q == math.floor(q):
            return math.inf
        if x != math.floor(x):
            return math.nan
    s = math.pow(q, -x)
    a = q
    i = 0
    b = 0.0
    while i < 9 or a <= 9.0:
        i += 1
        a += 1.0
        b = math.pow(a, -x)
        s += b
        if -_MACHEP * s < b < _MACHEP * s:
            return s
    w = a
    s += b * w / (x - 1.0)
    s -= 0.5 * b
    a = 1.0
    k = 0.0
    for j in range(12):
        a *= x + k
        b /= w
        t = a * b / _ZETA_A[j]
        s = s + t
        if abs(t / s) < _MACHEP:
            return s
        k += 1.0
        a *= x + k
        b /= w
        k += 1.0
    return s


@_jit
def digamma(x):
    if x == 0.0:
        return math.copysign(math.inf, -x)
    if x < 0.0:
        if x == math.trunc(x):
            return math.nan
        r = x - math.trunc(x)
        return digamma(1.0 - x) - math.pi / math.tan(math.pi * r)
    result = 0.0
    while x < 10.0:
        result -= 1.0 / x
        x += 1.0
    if x == 10.0:
        return result + _PSI_10
    y = 0.0
    if x < 1.0e17:
        z = 1.0 / (x * x)
        y = z * polevl(z, _DIGAMMA_A)
    return result + math.log(x) - (0.5 / x) - y


@_jit
def trigamma(x):
    sign = 1.0
    result = 0.0
    if x < 0.5:
        sign = -1.0
        sin_pi_x = math.sin(math.pi * x)
        result -= (math.pi * math.pi) / (sin_pi_x * sin_pi_x)
        x = 1.0 - x
    for _ in range(6):
        result += 1.0 / (x * x)
        x += 1.0
    ixx = 1.0 / (x * x)
    result += (1.0 + 1.0 / (2.0 * x) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x
    return sign * result


@_jit
def polygamma(n, x):
    """The ``n``-th derivative of digamma (``n`` a non-negative integer)."""
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    return sign * math.exp(math.lgamma(n + 1.0)) * zeta(n + 1.0, x)


@_jit
def erfinv(y):
    """Rational first guess refined by two Newton steps (torch's ``calc_erfinv``)."""
    y_abs = abs(y)
    if y_abs > 1.0:
        return math.nan
    if y_abs == 1.0:
        return math.copysign(math.inf, y)
    if y_abs <= 0.7:
        z = y * y
        num = ((-0.140543331 * z + 0.914624893) * z - 1.645349621) * z + 0.886226899
        dem = (((0.012229801 * z - 0.329097515) * z + 1.442710462) * z - 2.118377725) * z + 1.0
        x = y * num / dem
    else:
        z = math.sqrt(-math.log((1.0 - y_abs) / 2.0))
        num = ((1.641345311 * z + 3.429567803) * z - 1.624906493) * z - 1.970840454
        dem = (1.637067800 * z + 3.543889200) * z + 1.0
        x = math.copysign(num, y) / dem
    two_over_sqrt_pi = 1.1283791670955126
    x = x - (math.erf(x) - y) / (two_over_sqrt_pi * math.exp(-x * x))
    x = x - (math.erf(x) - y) / (two_over_sqrt_pi * math.exp(-x * x))
    return x


@_jit
def erfcx(x):
    """``exp(x*x) * erfc(x)``: direct in float64 up to 26 (where erfc is still normal and
    exp(x*x) finite); above, the asymptotic series (terms to x**-10, error < 1e-12)."""
    if x != x:
        return x
    if x < 26.0:
        return math.exp(x * x) * math.erfc(x) if x > -26.7 else math.inf
    inv = 1.0 / (x * x)
    series = 1.0 - inv * (0.5 - inv * (0.75 - inv * (1.875 - inv * 6.5625)))
    return series / (x * 1.7724538509055159)


_NDTRI_P0 = np.array([
    -5.99633501014107895267E1, 9.80010754185999661536E1, -5.66762857469070293439E1,
    1.39312609387279679503E1, -1.23916583867381258016E0])
_NDTRI_Q0 = np.array([
    1.00000000000000000000E0, 1.95448858338141759834E0, 4.67627912898881538453E0,
    8.63602421390890590575E1, -2.25462687854119370527E2, 2.00260212380060660359E2,
    -8.20372256168333339912E1, 1.59056225126211695515E1, -1.18331621121330003142E0])
_NDTRI_P1 = np.array([
    4.05544892305962419923E0, 3.15251094599893866154E1, 5.71628192246421288162E1,
    4.40805073893200834700E1, 1.46849561928858024014E1, 2.18663306850790267539E0,
    -1.40256079171354495875E-1, -3.50424626827848203418E-2, -8.57456785154685413611E-4])
_NDTRI_Q1 = np.array([
    1.00000000000000000000E0, 1.57799883256466749731E1, 4.53907635128879210584E1,
    4.13172038254672030440E1, 1.50425385692907503408E1, 2.50464946208309415979E0,
    -1.42182922854787788574E-1, -3.80806407691578277194E-2, -9.33259480895457427372E-4])
_NDTRI_P2 = np.array([
    3.23774891776946035970E0, 6.91522889068984211695E0, 3.93881025292474443415E0,
    1.33303460815807542389E0, 2.01485389549179081538E-1, 1.23716634817820021358E-2,
    3.01581553508235416007E-4, 2.65806974686737550832E-6, 6.23974539184983293730E-9])
_NDTRI_Q2 = np.array([
    1.00000000000000000000E0, 6.02427039364742014255E0, 3.67983563856160859403E0,
    1.37702099489081330271E0, 2.16236993594496635890E-1, 1.34204006088543189037E-2,
    3.28014464682127739104E-4, 2.89247864745380683936E-6, 6.79019408009981274425E-9])


@_jit
def ndtri(y0):
    """The inverse of the standard normal CDF."""
    if y0 == 0.0:
        return -math.inf
    if y0 == 1.0:
        return math.inf
    if y0 < 0.0 or y0 > 1.0 or y0 != y0:
        return math.nan
    code = True
    y = y0
    if y > 1.0 - 0.13533528323661269189:
        y = 1.0 - y
        code = False
    if y > 0.13533528323661269189:
        y = y - 0.5
        y2 = y * y
        x = y + y * (y2 * polevl(y2, _NDTRI_P0) / polevl(y2, _NDTRI_Q0))
        return x * 2.50662827463100050242
    x = math.sqrt(-2.0 * math.log(y))
    x0 = x - math.log(x) / x
    z = 1.0 / x
    if x < 8.0:
        x1 = z * polevl(z, _NDTRI_P1) / polevl(z, _NDTRI_Q1)
    else:
        x1 = z * polevl(z, _NDTRI_P2) / polevl(z, _NDTRI_Q2)
    x = x0 - x1
    return -x if code else x


@_jit
def log_ndtr(x):
    t = x * 0.7071067811865476
    if x < -1.0:
        return math.log(erfcx(-t) / 2.0) - t * t
    return math.log1p(-math.erfc(t) / 2.0)


@_jit
def i0e(x):
    """``exp(-|x|) * I0(x)``."""
    x = abs(x)
    if x <= 8.0:
        return chbevl(x / 2.0 - 2.0, _MODIFIED_BESSEL_I0_A)
    return chbevl(32.0 / x - 2.0, _MODIFIED_BESSEL_I0_B) / math.sqrt(x)


@_jit
def i1e(x):
    """``exp(-|x|) * I1(x)``."""
    a = abs(x)
    if a <= 8.0:
        out = chbevl(a / 2.0 - 2.0, _MODIFIED_BESSEL_I1_A) * a
    else:
        out = chbevl(32.0 / a - 2.0, _MODIFIED_BESSEL_I1_B) / math.sqrt(a)
    return -out if x < 0.0 else out


@_jit
def frexp_mantissa(x):
    """The mantissa of ``x`` in [0.5, 1) (``x`` itself for 0, inf and NaN)."""
    if x != x or x == 0.0 or math.isinf(x):
        return x
    return math.frexp(x)[0]


@_jit
def frexp_exponent(x):
    """The power of two of ``x`` (0 for 0, inf and NaN, as torch's frexp)."""
    if x != x or x == 0.0 or math.isinf(x):
        return 0
    return math.frexp(x)[1]

"""Scan templates beyond cumsum/cumprod (:func:`simaccel.codegen.templates.scan`): running
max/min with the index of the extreme, and the running log-sum-exp. Rows are the
(OUTER, N, INNER) view of a dense tensor (element ``k`` of row (o, i) at
``(o*N + k)*INNER + i``)."""
from __future__ import annotations


def cumextreme(is_max: bool, float_values: bool) -> str:
    """``cummax``/``cummin`` as ATen computes them: a later equal value takes over (>=),
    and a NaN, once seen, stays with its index."""
    cmp = ">=" if is_max else "<="
    take = (f"v != v or (best == best and v {cmp} best)" if float_values
            else f"v {cmp} best")
    return ("def kernel(vals, idx, x, OUTER, N, INNER):\n"
            "    for o in prange(OUTER):\n"
            "        for i in range(INNER):\n"
            "            base = o*N*INNER + i\n"
            "            if N == 0:\n"
            "                continue\n"
            "            best = x[base]\n"
            "            arg = 0\n"
            "            for k in range(N):\n"
            "                v = x[base + k*INNER]\n"
            f"                if {take}:\n"
            "                    best = v\n"
            "                    arg = k\n"
            "                vals[base + k*INNER] = best\n"
            "                idx[base + k*INNER] = arg\n")


def logcumsumexp() -> str:
    """Running ``log(sum(exp(x)))`` in float64, by ATen's ``_log_add_exp_helper``
    (two infinities of one sign stay that infinity; NaN propagates)."""
    return ("def kernel(out, x, OUTER, N, INNER):\n"
            "    for o in prange(OUTER):\n"
            "        for i in range(INNER):\n"
            "            base = o*N*INNER + i\n"
            "            acc = -np.inf\n"
            "            for k in range(N):\n"
            "                v = np.float64(x[base + k*INNER])\n"
            "                if k == 0:\n"
            "                    acc = v\n"
            "                else:\n"
            "                    lo = v if v != v else min(acc, v)\n"
            "                    hi = v if v != v else max(acc, v)\n"
            "                    if lo != hi or np.isfinite(lo):\n"
            "                        acc = hi + np.log1p(np.exp(lo - hi))\n"
            "                out[base + k*INNER] = acc\n")

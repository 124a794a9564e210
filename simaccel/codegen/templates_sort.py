"""Sorting templates: sort, top-k, k-th value / median, binary search.

Rows are the (OUTER, N, INNER) view of a dense tensor: element ``k`` of row (o, i) sits
at ``(o*N + k)*INNER + i``. Orders are stable (equal keys keep their order, as
``torch.sort(stable=True)``); NaN sorts as the largest value, as in torch: last when
ascending, first when descending. Keys are float or integer values (bool arrives as int8).
"""
from __future__ import annotations


def _order(float_keys: bool) -> str:
    """``order(keys, desc)``: the stable sorting permutation of ``keys``. Descending sorts
    the negated keys (``~`` for integers: no overflow at the minimum) and moves the NaNs,
    which numba's mergesort leaves last in their original order, to the front."""
    neg = "-keys" if float_keys else "~keys"
    nan_front = ("    m = 0\n"
                 "    for k in range(n):\n"
                 "        if keys[k] != keys[k]:\n"
                 "            m += 1\n"
                 "    if m == 0:\n"
                 "        return perm\n"
                 "    out = np.empty(n, np.int64)\n"
                 "    out[:m] = perm[n - m:]\n"
                 "    out[m:] = perm[:n - m]\n"
                 "    return out\n") if float_keys else "    return perm\n"
    return ("@numba.njit(inline='always')\n"
            "def order(keys, desc):\n"
            "    n = keys.size\n"
            "    if not desc:\n"
            "        return np.argsort(keys, kind='mergesort')\n"
            f"    perm = np.argsort({neg}, kind='mergesort')\n" + nan_front)


_GATHER_ROW = (
    "            base = o*N*INNER + i\n"
    "            keys = np.empty(N, KEY)\n"
    "            for k in range(N):\n"
    "                keys[k] = x[base + k*INNER]\n")


def sort(float_keys: bool, key_dtype: str) -> str:
    """Sorted values and their indices along the middle axis."""
    return (_order(float_keys) + "\n\n"
            f"KEY = np.{key_dtype}\n\n\n"
            "def kernel(vals, idx, x, OUTER, N, INNER, DESC):\n"
            "    for o in prange(OUTER):\n"
            "        for i in range(INNER):\n" + _GATHER_ROW +
            "            perm = order(keys, DESC)\n"
            "            for k in range(N):\n"
            "                p = perm[k]\n"
            "                vals[base + k*INNER] = x[base + p*INNER]\n"
            "                idx[base + k*INNER] = p\n")


_BEFORE = (
    "@numba.njit(inline='always')\n"
    "def before(a, b, largest):\n"
    "    if largest:\n"
    "        return a > b or (a != a and b == b)\n"
    "    return a < b or (b != b and a == a)\n")


def topk(float_keys: bool, key_dtype: str) -> str:
    """The ``K`` largest (or smallest) of each row, in order, with their indices. Few of
    many (``K*8 < N``, ``K <= 64``) stream the row through a sorted buffer of ``K``
    (an element past the buffer's last costs one compare); else the row is sorted."""
    return (_order(float_keys) + "\n\n" + _BEFORE + "\n\n"
            f"KEY = np.{key_dtype}\n\n\n"
            "def kernel(vals, idx, x, OUTER, N, INNER, K, LARGEST):\n"
            "    for o in prange(OUTER):\n"
            "        for i in range(INNER):\n" + _GATHER_ROW +
            "            obase = o*K*INNER + i\n"
            "            if K*8 >= N or K > 64:\n"
            "                perm = order(keys, LARGEST)\n"
            "                for k in range(K):\n"
            "                    vals[obase + k*INNER] = keys[perm[k]]\n"
            "                    idx[obase + k*INNER] = perm[k]\n"
            "                continue\n"
            "            bv = np.empty(K, KEY)\n"
            "            bi = np.empty(K, np.int64)\n"
            "            cnt = 0\n"
            "            for k in range(N):\n"
            "                v = keys[k]\n"
            "                if cnt == K and not before(v, bv[K - 1], LARGEST):\n"
            "                    continue\n"
            "                j = cnt if cnt < K else K - 1\n"
            "                while j > 0 and before(v, bv[j - 1], LARGEST):\n"
            "                    if j < K:\n"
            "                        bv[j] = bv[j - 1]\n"
            "                        bi[j] = bi[j - 1]\n"
            "                    j -= 1\n"
            "                bv[j] = v\n"
            "                bi[j] = k\n"
            "                if cnt < K:\n"
            "                    cnt += 1\n"
            "            for k in range(K):\n"
            "                vals[obase + k*INNER] = bv[k]\n"
            "                idx[obase + k*INNER] = bi[k]\n")


#: select modes: the K-th smallest (1-based), the median (NaN if the row has one: the
#: first NaN), the median of the non-NaN values (NaN if there are none).
KTH, MEDIAN, NANMEDIAN = 0, 1, 2


def select(key_dtype: str) -> str:
    """One order statistic per row (see the modes above) and its index."""
    return (_order(True) + "\n\n"
            f"KEY = np.{key_dtype}\n\n\n"
            "def kernel(vals, idx, x, OUTER, N, INNER, K, MODE):\n"
            "    for o in prange(OUTER):\n"
            "        for i in range(INNER):\n" + _GATHER_ROW +
            "            perm = order(keys, False)\n"
            "            valid = 0\n"
            "            for k in range(N):\n"
            "                if keys[k] == keys[k]:\n"
            "                    valid += 1\n"
            f"            if MODE == {KTH}:\n"
            "                pos = K - 1\n"
            f"            elif MODE == {MEDIAN}:\n"
            "                pos = (N - 1) // 2 if valid == N else valid\n"
            "            else:\n"
            "                pos = (valid - 1) // 2 if valid > 0 else 0\n"
            "            vals[o*INNER + i] = keys[perm[pos]]\n"
            "            idx[o*INNER + i] = perm[pos]\n")


def searchsorted(right: bool, with_sorter: bool) -> str:
    """For each value of row ``r`` (``ROWS`` rows of ``L``), the insertion point in the
    sorted row of ``M`` (one shared row when ``SEQ_ROWS == 1``), as ATen's
    ``cus_lower_bound`` / ``cus_upper_bound`` (a NaN value goes after everything)."""
    cond = "not (sv > v)" if right else "not (sv >= v)"
    fetch = "seq[row0 + sorter[row0 + mid]]" if with_sorter else "seq[row0 + mid]"
    args = "out, seq, vals, sorter" if with_sorter else "out, seq, vals"
    return (f"def kernel({args}, ROWS, M, L, SEQ_ROWS):\n"
            "    for r in prange(ROWS):\n"
            "        row0 = r*M if SEQ_ROWS > 1 else 0\n"
            "        for j in range(L):\n"
            "            v = vals[r*L + j]\n"
            "            lo = 0\n"
            "            hi = M\n"
            "            while lo < hi:\n"
            "                mid = (lo + hi) // 2\n"
            f"                sv = {fetch}\n"
            f"                if {cond}:\n"
            "                    lo = mid + 1\n"
            "                else:\n"
            "                    hi = mid\n"
            "            out[r*L + j] = lo\n")

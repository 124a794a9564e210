"""Hand-written kernel templates: matmul (integer dtypes) and cumulative sums/products.

Each template is the source of one function ``kernel(<flat buffers>, <int params>)``.
Shapes arrive as parameters, so one compiled template serves every shape; only the
operand layouts (row-major or transposed) are baked into the source. Float matmuls are
library calls (:mod:`simaccel.codegen.library`). The other templates have modules of
their own: ``templates_conv`` (convolution, numba's BLAS-backed ``np.dot``),
``templates_pool``, ``templates_sort``, ``templates_scan``, ``templates_scatter``.
"""
from __future__ import annotations


def _mat(name: str, off: str, rows: str, cols: str, transposed: bool) -> str:
    """Source viewing a flat buffer as a (rows, cols) matrix, C or F contiguous."""
    if transposed:
        return f"{name}[{off}:{off} + {rows}*{cols}].reshape(({cols}, {rows})).T"
    return f"{name}[{off}:{off} + {rows}*{cols}].reshape(({rows}, {cols}))"


def matmul(a_t: bool, b_t: bool) -> str:
    """Batched ``out[b] = a[b] @ b[b]`` by loops, for dtypes BLAS has no GEMM for (integers;
    float GEMMs are library calls, see :mod:`simaccel.codegen.library`). Batch strides may
    be 0 (broadcast)."""
    a = _mat("a", "ao", "M", "K", a_t)
    b = _mat("b", "bo", "K", "N", b_t)
    inner = (f"        A = {a}\n        B = {b}\n"
             f"        for i in range(M):\n"
             f"            for j in range(N):\n"
             f"                acc = 0\n"
             f"                for k in range(K):\n"
             f"                    acc += A[i, k] * B[k, j]\n"
             f"                out[oo + i*N + j] = acc\n")
    return (
        "def kernel(out, a, b, BATCH, M, K, N, a_off, a_bs, b_off, b_bs):\n"
        "    if K == 0:\n"
        "        out[:BATCH*M*N] = 0\n"
        "        return\n"
        "    if M == 0 or N == 0:\n"
        "        return\n"
        "    for bi in range(BATCH):\n"
        "        ao = a_off + bi*a_bs\n"
        "        bo = b_off + bi*b_bs\n"
        "        oo = bi*M*N\n"
        + inner)


def scan(op: str, acc_ctor: str) -> str:
    """Inclusive cumulative sum/product along the middle axis of (OUTER, N, INNER)."""
    combine = "acc += x[base + k*INNER]" if op == "sum" else "acc *= x[base + k*INNER]"
    init = "0" if op == "sum" else "1"
    return ("def kernel(out, x, OUTER, N, INNER):\n"
            "    for o in prange(OUTER):\n"
            "        for i in range(INNER):\n"
            "            base = o*N*INNER + i\n"
            f"            acc = {acc_ctor}({init})\n"
            "            for k in range(N):\n"
            f"                {combine}\n"
            "                out[base + k*INNER] = acc\n")

"""Hand-written kernel templates: matmul, convolution, pooling, scans.

Each template is the source of one function ``kernel(<flat buffers>, <int params>)``.
Shapes arrive as parameters, so one compiled template serves every shape; only the
operand layouts (row-major or transposed) are baked into the source. Float matmuls are
library calls (:mod:`simaccel.codegen.library`); convolutions use numba's BLAS-backed
``np.dot``.
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


IM2COL = """
def im2col(x, cols, n, g, C, H, W, Cg, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW):
    L = OH*OW
    for c in range(Cg):
        base = (n*C + g*Cg + c)*H*W
        for kh in range(KH):
            for kw in range(KW):
                row = ((c*KH + kh)*KW + kw)*L
                for oh in range(OH):
                    ih = oh*SH - PH + kh*DH
                    for ow in range(OW):
                        iw = ow*SW - PW + kw*DW
                        if 0 <= ih < H and 0 <= iw < W:
                            cols[row + oh*OW + ow] = x[base + ih*W + iw]
                        else:
                            cols[row + oh*OW + ow] = 0
"""

COL2IM = """
def col2im(cols, gx, n, g, C, H, W, Cg, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW):
    L = OH*OW
    for c in range(Cg):
        base = (n*C + g*Cg + c)*H*W
        for kh in range(KH):
            for kw in range(KW):
                row = ((c*KH + kh)*KW + kw)*L
                for oh in range(OH):
                    ih = oh*SH - PH + kh*DH
                    if ih < 0 or ih >= H:
                        continue
                    for ow in range(OW):
                        iw = ow*SW - PW + kw*DW
                        if 0 <= iw < W:
                            gx[base + ih*W + iw] += cols[row + oh*OW + ow]
"""

CONV_PARAMS = "N, C, H, W, O, KH, KW, SH, SW, PH, PW, DH, DW, G, OH, OW"
_GEOM = "C, H, W, Cg, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW"


def conv2d() -> str:
    """Forward 2-D convolution by im2col + GEMM per (image, group)."""
    return ("@numba.njit(inline='always')\n" + IM2COL.strip() + "\n\n\n"
            f"def kernel(out, x, w, cols, {CONV_PARAMS}):\n"
            "    Cg = C // G\n    Og = O // G\n    L = OH*OW\n    R = Cg*KH*KW\n"
            "    for n in range(N):\n"
            "        for g in range(G):\n"
            f"            im2col(x, cols, n, g, {_GEOM})\n"
            "            Wm = w[g*Og*R:(g + 1)*Og*R].reshape((Og, R))\n"
            "            Cm = cols[0:R*L].reshape((R, L))\n"
            "            o0 = (n*O + g*Og)*L\n"
            "            np.dot(Wm, Cm, out[o0:o0 + Og*L].reshape((Og, L)))\n")


def conv2d_backward() -> str:
    """Gradients of a 2-D convolution w.r.t. its input and weight."""
    return ("@numba.njit(inline='always')\n" + IM2COL.strip() + "\n\n\n"
            "@numba.njit(inline='always')\n" + COL2IM.strip() + "\n\n\n"
            f"def kernel(gx, gw, go, x, w, cols, gcols, {CONV_PARAMS}, want_gx, want_gw):\n"
            "    Cg = C // G\n    Og = O // G\n    L = OH*OW\n    R = Cg*KH*KW\n"
            "    if want_gx:\n        gx[:N*C*H*W] = 0\n"
            "    if want_gw:\n        gw[:O*R] = 0\n"
            "    for n in range(N):\n"
            "        for g in range(G):\n"
            "            o0 = (n*O + g*Og)*L\n"
            "            Go = go[o0:o0 + Og*L].reshape((Og, L))\n"
            "            if want_gw:\n"
            f"                im2col(x, cols, n, g, {_GEOM})\n"
            "                Cm = cols[0:R*L].reshape((R, L))\n"
            "                Gw = gw[g*Og*R:(g + 1)*Og*R].reshape((Og, R))\n"
            "                Gw += np.dot(Go, Cm.T)\n"
            "            if want_gx:\n"
            "                Wm = w[g*Og*R:(g + 1)*Og*R].reshape((Og, R))\n"
            "                np.dot(Wm.T, Go, gcols[0:R*L].reshape((R, L)))\n"
            f"                col2im(gcols, gx, n, g, {_GEOM})\n")


POOL_PARAMS = "NC, H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW"


def max_pool2d() -> str:
    """Max pooling with the flat (h*W + w) index of each maximum, NaN propagating."""
    return (f"def kernel(out, idx, x, {POOL_PARAMS}):\n"
            "    for nc in prange(NC):\n"
            "        base = nc*H*W\n"
            "        for oh in range(OH):\n"
            "            for ow in range(OW):\n"
            "                best = -np.inf\n"
            "                arg = -1\n"
            "                for kh in range(KH):\n"
            "                    ih = oh*SH - PH + kh*DH\n"
            "                    if ih < 0 or ih >= H:\n"
            "                        continue\n"
            "                    for kw in range(KW):\n"
            "                        iw = ow*SW - PW + kw*DW\n"
            "                        if iw < 0 or iw >= W:\n"
            "                            continue\n"
            "                        v = x[base + ih*W + iw]\n"
            "                        if arg < 0 or v > best or (v != v and best == best):\n"
            "                            best = v\n"
            "                            arg = ih*W + iw\n"
            "                o = (nc*OH + oh)*OW + ow\n"
            "                out[o] = best\n"
            "                idx[o] = arg\n")


def max_pool2d_backward() -> str:
    return ("def kernel(gx, go, idx, NC, HW, OHW):\n"
            "    for nc in prange(NC):\n"
            "        for i in range(HW):\n"
            "            gx[nc*HW + i] = 0\n"
            "        for o in range(OHW):\n"
            "            gx[nc*HW + idx[nc*OHW + o]] += go[nc*OHW + o]\n")


_AVG_WINDOW = (
    "                hs = oh*SH - PH\n"
    "                ws = ow*SW - PW\n"
    "                he = min(hs + KH, H + PH)\n"
    "                we = min(ws + KW, W + PW)\n"
    "                pool = (he - hs)*(we - ws)\n"
    "                hs = max(hs, 0)\n"
    "                ws = max(ws, 0)\n"
    "                he = min(he, H)\n"
    "                we = min(we, W)\n"
    "                if DIVISOR > 0:\n"
    "                    div = DIVISOR\n"
    "                elif INCLUDE_PAD:\n"
    "                    div = pool\n"
    "                else:\n"
    "                    div = (he - hs)*(we - ws)\n")

AVG_PARAMS = "NC, H, W, OH, OW, KH, KW, SH, SW, PH, PW, INCLUDE_PAD, DIVISOR"


def avg_pool2d() -> str:
    return (f"def kernel(out, x, {AVG_PARAMS}):\n"
            "    for nc in prange(NC):\n"
            "        for oh in range(OH):\n"
            "            for ow in range(OW):\n"
            + _AVG_WINDOW +
            "                acc = 0.0\n"
            "                for ih in range(hs, he):\n"
            "                    for iw in range(ws, we):\n"
            "                        acc += x[(nc*H + ih)*W + iw]\n"
            "                out[(nc*OH + oh)*OW + ow] = acc / div\n")


def avg_pool2d_backward() -> str:
    return (f"def kernel(gx, go, {AVG_PARAMS}):\n"
            "    for nc in prange(NC):\n"
            "        for i in range(H*W):\n"
            "            gx[nc*H*W + i] = 0\n"
            "        for oh in range(OH):\n"
            "            for ow in range(OW):\n"
            + _AVG_WINDOW +
            "                g = go[(nc*OH + oh)*OW + ow] / div\n"
            "                for ih in range(hs, he):\n"
            "                    for iw in range(ws, we):\n"
            "                        gx[(nc*H + ih)*W + iw] += g\n")


_ADAPTIVE_WINDOW = (
    "                hs = (oh*H) // OH\n"
    "                he = -((-(oh + 1)*H) // OH)\n"
    "                ws = (ow*W) // OW\n"
    "                we = -((-(ow + 1)*W) // OW)\n"
    "                div = (he - hs)*(we - ws)\n")


def adaptive_avg_pool2d() -> str:
    return ("def kernel(out, x, NC, H, W, OH, OW):\n"
            "    for nc in prange(NC):\n"
            "        for oh in range(OH):\n"
            "            for ow in range(OW):\n"
            + _ADAPTIVE_WINDOW +
            "                acc = 0.0\n"
            "                for ih in range(hs, he):\n"
            "                    for iw in range(ws, we):\n"
            "                        acc += x[(nc*H + ih)*W + iw]\n"
            "                out[(nc*OH + oh)*OW + ow] = acc / div\n")


def adaptive_avg_pool2d_backward() -> str:
    return ("def kernel(gx, go, NC, H, W, OH, OW):\n"
            "    for nc in prange(NC):\n"
            "        for i in range(H*W):\n"
            "            gx[nc*H*W + i] = 0\n"
            "        for oh in range(OH):\n"
            "            for ow in range(OW):\n"
            + _ADAPTIVE_WINDOW +
            "                g = go[(nc*OH + oh)*OW + ow] / div\n"
            "                for ih in range(hs, he):\n"
            "                    for iw in range(ws, we):\n"
            "                        gx[(nc*H + ih)*W + iw] += g\n")


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

"""Convolution templates for 1-, 2- and 3-d convolutions (a 1-d or 2-d one is a 3-d one
with size-1 leading spatial dims), with groups, strides, padding and dilation: im2col
plus a BLAS GEMM (numba's ``np.dot``) per (image, group), and the two gradients, which
also run transposed convolutions (a transposed convolution's output is the input
gradient of the convolution it transposes).

Geometry (all ints): ``N, C, D, H, W`` (input), ``O`` (output channels), ``KD, KH, KW``
(kernel), strides ``SD, SH, SW``, padding ``PD, PH, PW``, dilation ``DD, DH, DW``,
``G`` (groups), ``OD, OH, OW`` (output). A pointwise convolution (1x1x1 kernel, unit
stride, no padding) multiplies the input in place, without im2col.
"""
from __future__ import annotations

GEOMETRY = ("N, C, D, H, W, O, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, G, "
            "OD, OH, OW")
_WINDOW = "C, D, H, W, Cg, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, OD, OH, OW"

_SCATTER_GATHER = """
@numba.njit(inline='always')
def window_rows(buf, cols, n, g, {window}, gather):
    L = OD*OH*OW
    for c in range(Cg):
        base = (n*C + g*Cg + c)*D*H*W
        for kd in range(KD):
            for kh in range(KH):
                for kw in range(KW):
                    row = (((c*KD + kd)*KH + kh)*KW + kw)*L
                    for od in range(OD):
                        idp = od*SD - PD + kd*DD
                        for oh in range(OH):
                            ih = oh*SH - PH + kh*DH
                            inside = 0 <= idp < D and 0 <= ih < H
                            r0 = row + (od*OH + oh)*OW
                            b0 = base + (idp*H + ih)*W
                            for ow in range(OW):
                                iw = ow*SW - PW + kw*DW
                                if gather:
                                    if inside and 0 <= iw < W:
                                        cols[r0 + ow] = buf[b0 + iw]
                                    else:
                                        cols[r0 + ow] = 0
                                elif inside and 0 <= iw < W:
                                    buf[b0 + iw] += cols[r0 + ow]
""".format(window=_WINDOW)

_PROLOGUE = ("    Cg = C // G\n    Og = O // G\n    L = OD*OH*OW\n    R = Cg*KD*KH*KW\n"
             "    direct = KD*KH*KW == 1 and SD*SH*SW == 1 and PD + PH + PW == 0 \\\n"
             "        and OD*OH*OW == D*H*W\n")


def _helpers() -> str:
    return _SCATTER_GATHER.strip() + "\n\n\n"


#: ``Cm``: group g's input of sample n as (R, L) columns: x itself when the window is
#: the identity (1x1, stride 1, no padding), else gathered into ``cols``
_INPUT_COLUMNS = (
    "            if direct:\n"
    "                b0 = (n*C + g*Cg)*L\n"
    "                Cm = x[b0:b0 + R*L].reshape((R, L))\n"
    "            else:\n"
    f"                window_rows(x, cols, n, g, {_WINDOW}, True)\n"
    "                Cm = cols[0:R*L].reshape((R, L))\n")


def conv_forward() -> str:
    """``out = conv(x, w)`` (no bias: the lowering adds it in a fused epilogue)."""
    return (_helpers() + f"def kernel(out, x, w, cols, {GEOMETRY}):\n" + _PROLOGUE +
            "    if R == 0:\n        out[:N*O*L] = 0\n        return\n"
            "    if L == 0 or Og == 0:\n        return\n"
            "    for n in range(N):\n"
            "        for g in range(G):\n" + _INPUT_COLUMNS +
            "            Wm = w[g*Og*R:(g + 1)*Og*R].reshape((Og, R))\n"
            "            o0 = (n*O + g*Og)*L\n"
            "            np.dot(Wm, Cm, out[o0:o0 + Og*L].reshape((Og, L)))\n")


def conv_input_grad() -> str:
    """``gx`` = the gradient of ``conv(x, w)`` w.r.t. ``x`` for output gradient ``go``
    (also the forward of the transposed convolution of ``go``)."""
    return (_helpers() + f"def kernel(gx, go, w, gcols, {GEOMETRY}):\n" + _PROLOGUE +
            "    gx[:N*C*D*H*W] = 0\n"
            "    if R == 0 or L == 0 or Og == 0:\n        return\n"
            "    for n in range(N):\n"
            "        for g in range(G):\n"
            "            o0 = (n*O + g*Og)*L\n"
            "            Go = go[o0:o0 + Og*L].reshape((Og, L))\n"
            "            Wm = w[g*Og*R:(g + 1)*Og*R].reshape((Og, R))\n"
            "            if direct:\n"
            "                b0 = (n*C + g*Cg)*L\n"
            "                np.dot(Wm.T, Go, gx[b0:b0 + R*L].reshape((R, L)))\n"
            "            else:\n"
            "                np.dot(Wm.T, Go, gcols[0:R*L].reshape((R, L)))\n"
            f"                window_rows(gx, gcols, n, g, {_WINDOW}, False)\n")


def conv_weight_grad() -> str:
    """``gw`` = the gradient of ``conv(x, w)`` w.r.t. ``w`` for output gradient ``go``."""
    return (_helpers() + f"def kernel(gw, go, x, cols, {GEOMETRY}):\n" + _PROLOGUE +
            "    gw[:O*R] = 0\n"
            "    if R == 0 or L == 0 or Og == 0:\n        return\n"
            "    for n in range(N):\n"
            "        for g in range(G):\n" + _INPUT_COLUMNS +
            "            o0 = (n*O + g*Og)*L\n"
            "            Go = go[o0:o0 + Og*L].reshape((Og, L))\n"
            "            Gw = gw[g*Og*R:(g + 1)*Og*R].reshape((Og, R))\n"
            "            Gw += np.dot(Go, Cm.T)\n")

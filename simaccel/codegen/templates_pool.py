"""Pooling templates for 1-, 2- and 3-d pooling (fewer spatial dims are size-1 leading
ones): max (NaN propagating, with the flat index ``(d*H + h)*W + w`` of each maximum, as
ATen returns it), average (ATen's divisor rules), adaptive average and adaptive max, and
their backwards. ``NC`` planes of ``D*H*W`` in, ``OD*OH*OW`` out, row-major."""
from __future__ import annotations

WINDOW = "NC, D, H, W, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW"
_PLANES = ("    for nc in prange(NC):\n"
           "        for od in range(OD):\n"
           "            for oh in range(OH):\n"
           "                for ow in range(OW):\n")
_TAKE_MAX = ("                            v = x[base + (idp*H + ih)*W + iw]\n"
             "                            if arg < 0 or v > best or (v != v and best == best):\n"
             "                                best = v\n"
             "                                arg = (idp*H + ih)*W + iw\n")
_STORE_MAX = ("                    o = ((nc*OD + od)*OH + oh)*OW + ow\n"
              "                    out[o] = best\n"
              "                    idx[o] = arg\n")


def max_pool() -> str:
    return (f"def kernel(out, idx, x, {WINDOW}, DD, DH, DW):\n" + _PLANES +
            "                    base = nc*D*H*W\n"
            "                    best = -np.inf\n"
            "                    arg = -1\n"
            "                    for kd in range(KD):\n"
            "                        idp = od*SD - PD + kd*DD\n"
            "                        if idp < 0 or idp >= D:\n"
            "                            continue\n"
            "                        for kh in range(KH):\n"
            "                            ih = oh*SH - PH + kh*DH\n"
            "                            if ih < 0 or ih >= H:\n"
            "                                continue\n"
            "                            for kw in range(KW):\n"
            "                                iw = ow*SW - PW + kw*DW\n"
            "                                if iw < 0 or iw >= W:\n"
            "                                    continue\n"
            + _indent(_TAKE_MAX, 4) + _STORE_MAX)


def _indent(src: str, spaces: int) -> str:
    return "".join(" " * spaces + line + "\n" for line in src.splitlines())


def scatter_by_index() -> str:
    """The backward of max pooling (plain and adaptive): each output gradient goes to the
    input element its index names."""
    return ("def kernel(gx, go, idx, NC, DHW, ODHW):\n"
            "    for nc in prange(NC):\n"
            "        for i in range(DHW):\n"
            "            gx[nc*DHW + i] = 0\n"
            "        for o in range(ODHW):\n"
            "            gx[nc*DHW + idx[nc*ODHW + o]] += go[nc*ODHW + o]\n")


_AVG_WINDOW = (
    "                    ds = od*SD - PD\n"
    "                    hs = oh*SH - PH\n"
    "                    ws = ow*SW - PW\n"
    "                    de = min(ds + KD, D + PD)\n"
    "                    he = min(hs + KH, H + PH)\n"
    "                    we = min(ws + KW, W + PW)\n"
    "                    pool = (de - ds)*(he - hs)*(we - ws)\n"
    "                    ds = max(ds, 0)\n"
    "                    hs = max(hs, 0)\n"
    "                    ws = max(ws, 0)\n"
    "                    de = min(de, D)\n"
    "                    he = min(he, H)\n"
    "                    we = min(we, W)\n"
    "                    if DIVISOR > 0:\n"
    "                        div = DIVISOR\n"
    "                    elif INCLUDE_PAD:\n"
    "                        div = pool\n"
    "                    else:\n"
    "                        div = (de - ds)*(he - hs)*(we - ws)\n")
_WINDOW_LOOPS = ("                    for idp in range(ds, de):\n"
                 "                        for ih in range(hs, he):\n"
                 "                            for iw in range(ws, we):\n")
AVG_PARAMS = f"{WINDOW}, INCLUDE_PAD, DIVISOR"


def _mean_pool(params: str, window: str) -> str:
    """Each output the mean of its window (``window`` sets ds..we and ``div``)."""
    return (f"def kernel(out, x, {params}):\n" + _PLANES + window +
            "                    acc = 0.0\n" + _WINDOW_LOOPS +
            "                                acc += x[((nc*D + idp)*H + ih)*W + iw]\n"
            "                    out[((nc*OD + od)*OH + oh)*OW + ow] = acc / div\n")


def _mean_pool_backward(params: str, window: str) -> str:
    """Each output gradient spread evenly over its window."""
    return (f"def kernel(gx, go, {params}):\n"
            "    for nc in prange(NC):\n"
            "        for i in range(D*H*W):\n"
            "            gx[nc*D*H*W + i] = 0\n"
            "        for od in range(OD):\n"
            "            for oh in range(OH):\n"
            "                for ow in range(OW):\n" + window +
            "                    g = go[((nc*OD + od)*OH + oh)*OW + ow] / div\n" + _WINDOW_LOOPS +
            "                                gx[((nc*D + idp)*H + ih)*W + iw] += g\n")


def avg_pool() -> str:
    return _mean_pool(AVG_PARAMS, _AVG_WINDOW)


def avg_pool_backward() -> str:
    return _mean_pool_backward(AVG_PARAMS, _AVG_WINDOW)


_ADAPTIVE = (
    "                    ds = (od*D) // OD\n"
    "                    de = -((-(od + 1)*D) // OD)\n"
    "                    hs = (oh*H) // OH\n"
    "                    he = -((-(oh + 1)*H) // OH)\n"
    "                    ws = (ow*W) // OW\n"
    "                    we = -((-(ow + 1)*W) // OW)\n"
    "                    div = (de - ds)*(he - hs)*(we - ws)\n")
ADAPTIVE_PARAMS = "NC, D, H, W, OD, OH, OW"


def adaptive_avg_pool() -> str:
    return _mean_pool(ADAPTIVE_PARAMS, _ADAPTIVE)


def adaptive_avg_pool_backward() -> str:
    return _mean_pool_backward(ADAPTIVE_PARAMS, _ADAPTIVE)


def adaptive_max_pool() -> str:
    take = _TAKE_MAX.replace(" " * 28, " " * 32)
    return (f"def kernel(out, idx, x, {ADAPTIVE_PARAMS}):\n" + _PLANES + _ADAPTIVE +
            "                    base = nc*D*H*W\n"
            "                    best = -np.inf\n"
            "                    arg = -1\n" + _WINDOW_LOOPS + take + _STORE_MAX)

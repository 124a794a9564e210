"""Scatter templates whose targets depend on a running count (not expressible as one
store per source element)."""
from __future__ import annotations


def masked_scatter() -> str:
    """``out[i] = src[k]; k += 1`` for every set ``mask[i]``, in order (serial)."""
    return ("def kernel(out, mask, src, N):\n"
            "    k = 0\n"
            "    for i in range(N):\n"
            "        if mask[i]:\n"
            "            out[i] = src[k]\n"
            "            k += 1\n")


def masked_put(accumulate: bool) -> str:
    """``out[i*INNER:(i+1)*INNER] (+)= values[k*STEP:k*STEP + INNER]`` for the ``k``-th
    set ``mask[i]`` of ``M`` (serial: ``k`` counts the set flags in order, as ATen's
    boolean-mask ``index_put`` consumes its values; ``STEP`` 0: one row for every flag)."""
    store = "+=" if accumulate else "="
    return ("def kernel(out, values, mask, M, INNER, STEP):\n"
            "    k = 0\n"
            "    for i in range(M):\n"
            "        if mask[i]:\n"
            "            for j in range(INNER):\n"
            f"                out[i*INNER + j] {store} values[k*STEP + j]\n"
            "            k += 1\n")


def masked_gather() -> str:
    """``out[k] = src[i]`` for the ``k``-th set ``mask[i]`` (serial), zeros after the last
    (``out`` holds ``M`` elements)."""
    return ("def kernel(out, src, mask, N, M):\n"
            "    k = 0\n"
            "    for i in range(N):\n"
            "        if mask[i]:\n"
            "            if k < M:\n"
            "                out[k] = src[i]\n"
            "            k += 1\n"
            "    for j in range(min(k, M), M):\n"
            "        out[j] = 0\n")

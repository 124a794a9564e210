"""Counter-based random bits: the hash behind active dropout's mask on the device
(:mod:`simaccel.dropout_rng`).

:func:`random_bits` is written once in integer operators that mean the same on a Python
int, a numpy array (tier-0 kernels) and a torch tensor (the op's eager form), and is
compiled into the kernels that call it (:mod:`.kernel_lib` registers it with numba;
this module imports no numba, as a warm process runs cached kernels without it): every
tier gives the same bits. Values stay below 2**63 at every step (a 32-bit value times a
constant below 2**31), so int64 arithmetic never overflows anywhere.
"""
from __future__ import annotations

#: the bits every intermediate hash keeps
BITS32 = 0xFFFFFFFF
#: odd multipliers below 2**31: the two avalanche rounds' and the element index's
MIX_A, MIX_B, INDEX_MIX = 0x7FEB352D, 0x5BD1E995, 0x27D4EB2F
#: the golden-ratio step that gives each stream (a graph's dropouts) its own bits
STREAM_STEP = 0x9E3779B1
#: random bits per element: below 2**24, exact in float32 too
BITS = 24


def mix32(h):
    """One avalanche round on 32-bit values held in int64 (murmur3's finaliser shape)."""
    h = h ^ (h >> 16)
    h = (h * MIX_A) & BITS32
    h = h ^ (h >> 15)
    h = (h * MIX_B) & BITS32
    return h ^ (h >> 16)


def random_bits(index, seed, stream):
    """:data:`BITS` random bits for element ``index`` (int64, below 2**32) of stream
    ``stream`` under ``seed`` (int64 in ``[0, 2**63)``): two rounds, the seed's low
    half mixed in with the index, its high half with the stream."""
    salt = (stream * STREAM_STEP) & BITS32
    h = mix32(((index * INDEX_MIX) & BITS32) ^ (seed & BITS32))
    h = mix32(h ^ ((seed >> 32) ^ salt))
    return h >> (32 - BITS)

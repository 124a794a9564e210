"""The DMA engine's flat counters: their names, and the one place a batch is counted."""
from __future__ import annotations

from simaccel.dma.copy import MAPPED_ACCESS
from simaccel.dma.descriptor import KINDS

#: kind -> its (bytes, transfers, mapped bytes, mapped accesses) counter names, built once
#: (the hot path adds to them); only h2d reads and d2h writes can be mapped
STAT_KEYS = {kind: (f"{kind}.bytes", f"{kind}.transfers", f"{kind}.mapped_bytes",
                    f"{kind}.mapped_{MAPPED_ACCESS.get(kind, '')}s") for kind in KINDS}


def zero_stats() -> dict[str, float]:
    """Every counter at 0."""
    stats: dict[str, float] = {}
    for kind in (*KINDS, "staged"):
        stats[f"{kind}.bytes"] = 0
        stats[f"{kind}.transfers"] = 0
    stats.update(dict.fromkeys(("h2d.mapped_bytes", "h2d.mapped_reads", "d2h.mapped_bytes",
                                "d2h.mapped_writes"), 0))
    stats.update(descriptors=0, bursts=0, compute_items=0, compute_ns=0.0)
    return stats


def count_batch(stats: dict[str, float], keys: tuple[str, ...], descriptors: int, nbytes: int,
                bursts: int, staged_bytes: int, mapped_bytes: int, mapped_accesses: int,
                times: int = 1) -> None:
    """The one place copies are counted: ``times`` batches of one kind (``keys``: its
    counters, see :data:`STAT_KEYS`) into ``stats``; ``nbytes`` and ``descriptors`` include
    the mapped accesses (they cross the bus like copies)."""
    stats[keys[0]] += nbytes * times
    stats[keys[1]] += times
    if staged_bytes:
        stats["staged.bytes"] += staged_bytes * times
        stats["staged.transfers"] += times
    if mapped_accesses:
        stats[keys[2]] += mapped_bytes * times
        stats[keys[3]] += mapped_accesses * times
    stats["descriptors"] += descriptors * times
    stats["bursts"] += bursts * times

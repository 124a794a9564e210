"""What a DMA submit returns: per descriptor, where and when it ran, and the submit's
completion event; and how a submit is cut into runs of one kind (each placed as one
batch)."""
from __future__ import annotations

from dataclasses import dataclass

from simaccel.dma.descriptor import Descriptor


@dataclass(slots=True)
class DescriptorTiming:
    """Where and when one descriptor ran (ns)."""

    descriptor: Descriptor
    channel: int
    start_ns: float
    end_ns: float
    bursts: int


class Completion:
    """The completion event of one submit (a dmaengine cookie); read-only by convention.

    start_ns: earliest start of its descriptors (``not_before_ns`` if it had none).
    end_ns: latest end of its descriptors (ns); later work depending on these bytes should
        pass it as ``not_before_ns``.
    timings: one :class:`DescriptorTiming` per descriptor, in submit order.
    """

    # A plain slots class: one is made per submit, on every call's hot path.
    __slots__ = ("start_ns", "end_ns", "timings")

    def __init__(self, start_ns: float, end_ns: float,
                 timings: tuple[DescriptorTiming, ...] = ()):
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.timings = timings

    def __repr__(self) -> str:
        return (f"Completion(start_ns={self.start_ns}, end_ns={self.end_ns}, "
                f"descriptors={len(self.timings)})")

    @property
    def done(self) -> bool:
        """Always True: the copies were performed synchronously at submit."""
        return True

    def wait(self) -> float:
        """Block until the transfer is complete (it already is); returns ``end_ns``."""
        return self.end_ns


def kind_runs(descs: list[Descriptor]) -> list[tuple[str, tuple[list, ...]]]:
    """``descs`` cut into runs of consecutive descriptors of one kind, in order (a submit is
    placed in order), each as its (srcs, dsts, labels, staged) columns."""
    runs: list[tuple[str, tuple[list, ...]]] = []
    kind = None
    for d in descs:
        if d.kind != kind:
            kind = d.kind
            columns: tuple[list, ...] = ([], [], [], [])
            runs.append((kind, columns))
        columns[0].append(d.src)
        columns[1].append(d.dst)
        columns[2].append(d.label)
        columns[3].append(d.staged)
    return runs

"""What a DMA span is called in the trace, and the args it shows (decoded when the trace is
read from the compact facts recorded on every call)."""
from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=4096)
def span_names_of(kind: str, labels: tuple[str, ...], mapped: tuple[bool, ...]) -> tuple[str, ...]:
    return tuple((kind + " " + label if label else kind) + (" (mapped)" if is_mapped else "")
                 for label, is_mapped in zip(labels, mapped))


def span_names(kind: str, labels: tuple[str, ...], moved: list) -> tuple[str, ...]:
    """The spans' names of a batch (``"h2d buf3"``, ``"h2d x (mapped)"``); a program's
    batches repeat theirs every call, so they are made once."""
    return span_names_of(kind, labels, tuple(m[2] for m in moved))


def trace_args(facts: tuple) -> dict[str, Any]:
    """The trace ``args`` from the compact facts recorded on the hot path: () for a kernel
    without args, else one copy's (bytes, kind, bursts, channel, staged, strided, mapped)."""
    if not facts:
        return {}
    nbytes, kind, bursts, channel, staged, strided, mapped = facts
    args: dict[str, Any] = {"bytes": nbytes, "kind": kind, "bursts": bursts, "channel": channel}
    if staged:
        args["staged"] = True
    if mapped:
        args["mapped"] = True
    if strided is not None:
        args["src_shape"] = list(strided[0])
        args["src_strides"] = list(strided[1])
    return args

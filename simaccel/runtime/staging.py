"""Which per-call copies go through a bounce buffer: a DMA descriptor needs a source
address that is a multiple of ``DeviceConfig.alignment``; a host array elsewhere is
staged (copied to an aligned host buffer first), as a real driver stages unpinned or
misaligned memory."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from simaccel.errors import SimAccelError
from simaccel.runtime.hostmap import data_ptr
from simaccel.runtime.spec import InputPlan


def is_aligned(plan: InputPlan, host: np.ndarray, data_ptrs: Sequence[int] | None,
               alignment: int) -> bool:
    """True if input ``plan`` (its host array ``host``) can take a direct descriptor (its
    address is a multiple of ``alignment`` bytes); it must agree with the plan where a
    guard pins it."""
    if not host.size:  # an empty tensor moves nothing: its pointer is not in the plan
        return True
    aligned = data_ptr(plan.index, host, data_ptrs) % alignment == 0
    if plan.aligned is not None and plan.aligned != aligned:
        raise SimAccelError(
            f"input {plan.index} ({plan.buffer}) was compiled for a "
            f"{'direct' if plan.aligned else 'staged'} DMA but is "
            f"{'' if aligned else 'mis'}aligned now; the alignment guard should "
            f"have recompiled this graph (please report this)")
    return aligned


def staging_flags(plans: Sequence[InputPlan], srcs: Sequence[np.ndarray],
                  in_place: Sequence[bool], data_ptrs: Sequence[int] | None,
                  alignment: int) -> tuple[tuple[bool, ...], bool]:
    """Per streamed input (``plans``, their host arrays ``srcs``): True if it is staged
    (:func:`is_aligned` says no); an empty input moves nothing and an input its kernel
    reads or updates in host memory (``in_place``: host-mapped) takes no descriptor, so
    neither is, whatever its alignment (a training graph's parameter may be a view at
    any offset of a flat buffer). Also returns whether some input is empty (the caller
    shrinks its destinations)."""
    staged = []
    empty = False
    for plan, host, mapped in zip(plans, srcs, in_place):
        if mapped or not host.size:
            empty = empty or not host.size
            staged.append(False)
            continue
        # is_aligned inlined for the common case (this runs per input per call)
        ptr = data_ptrs[plan.index] if data_ptrs is not None else 0
        aligned = (ptr or data_ptr(plan.index, host, None)) % alignment == 0
        if plan.aligned is not None and plan.aligned != aligned:
            is_aligned(plan, host, data_ptrs, alignment)  # raises, naming the input
        staged.append(not aligned)
    return tuple(staged), empty


def check_program_alignment(spec: Any, device: Any) -> None:
    """A program's memory plan and DMA facts are made for one alignment (the frame's
    ``simaccel.device_config`` guard recompiles when it changes)."""
    if spec.alignment != device.config.alignment:
        raise SimAccelError(
            f"{spec.name} was planned for a device alignment of {spec.alignment} bytes, but "
            f"the device now uses {device.config.alignment}; call the compiled function "
            f"again so its device-config guard recompiles it, or restore the config")


def align_up(value: int, alignment: int) -> int:
    """``value`` rounded up to a multiple of ``alignment``."""
    return (value + alignment - 1) // alignment * alignment

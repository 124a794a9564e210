"""Putting DDP's gradient traffic on the simaccel device.

``DDP(torch.compile(model, backend="simaccel"))`` needs nothing from the user: when the
backend compiles a graph while a DDP forward runs, :func:`attach_active` registers
:func:`~simaccel.distributed.hook.dma_allreduce_hook` on that DDP module (once), and sets
the device's rank. A DDP module that already has a communication hook keeps it (DDP takes
one hook only); the compile report says so. :func:`attach` does the same for a DDP module
the caller names (``torch.compile(DDP(model))``, where no DDP forward runs at compile time).
"""
from __future__ import annotations

import logging
import weakref
from typing import Any

import torch.distributed as dist

from simaccel.distributed.hook import CollectiveState, dma_allreduce_hook
from simaccel.guards import dynamo
from simaccel.runtime.device import get_device

log = logging.getLogger("simaccel")

#: DDP module -> what attaching decided (the text compile reports carry)
_ATTACHED: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
#: DDP module -> its hook state, where the hook is simaccel's
_STATES: "weakref.WeakKeyDictionary[Any, CollectiveState]" = weakref.WeakKeyDictionary()

ATTACHED = "gradient buckets all-reduced through the simaccel DMA engine"


def attach(ddp: Any) -> str:
    """Route ``ddp``'s gradient all-reduce through the device (see the module doc);
    returns what was decided. Idempotent."""
    known = _ATTACHED.get(ddp)
    if known is not None:
        return known
    device = get_device()
    if dist.is_initialized():
        device.rank = dist.get_rank()
    state = CollectiveState(process_group=getattr(ddp, "process_group", None), device=device)
    try:
        ddp.register_comm_hook(state, dma_allreduce_hook)
    except RuntimeError as exc:  # DDP takes one hook: the user's stays
        decision = (f"the DDP module has a communication hook of its own ({exc}); its "
                    f"gradient buckets do not go through the simaccel DMA engine")
        log.warning("simaccel: %s", decision)
    else:
        decision = ATTACHED
        _STATES[ddp] = state
    _ATTACHED[ddp] = decision
    return decision


def attach_active() -> str:
    """:func:`attach` the DDP module whose forward is compiling; "" when there is none."""
    ddp = dynamo.active_ddp_module()
    return attach(ddp) if ddp is not None else ""


def collective_state(ddp: Any) -> CollectiveState | None:
    """The hook state of a DDP module simaccel attached to (buckets and bytes moved)."""
    return _STATES.get(ddp)

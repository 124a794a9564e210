"""What a backend compile knows of DistributedDataParallel: the DDP module whose forward
is running, and which DDPOptimizer split is being compiled.

``DistributedDataParallel._get_active_ddp_module`` (set while DDP's forward runs, so
while Dynamo compiles ``DDP(torch.compile(model))``) and the tracing context's
``ddp_optimizer_ctx`` (DDPOptimizer's per-frame state: ``curr_bucket`` is the index of
the last split it compiled) are private to torch.
"""
from __future__ import annotations

from typing import Any

__all__ = ["active_ddp_module", "ddp_split_index"]


def active_ddp_module() -> Any:
    """The ``DistributedDataParallel`` module whose forward is running, or None."""
    import torch.distributed as dist
    if not dist.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel._get_active_ddp_module()


def ddp_split_index() -> int | None:
    """The index (from 0) of the DDPOptimizer split graph being compiled, or None when
    the graph is not one (no DDPOptimizer in this compile)."""
    from torch._guards import TracingContext
    ctx = getattr(TracingContext.try_get(), "ddp_optimizer_ctx", None)
    if ctx is None:
        return None
    return int(ctx.curr_bucket) + 1

"""DDP's gradient all-reduce through the simulated device's DMA engine.

On an accelerator whose collectives run on the host (gloo), every gradient bucket DDP
reduces leaves the device and comes back: the bucket is DMA'd device -> host into a
staging tensor, all-reduced there, and DMA'd host -> device into the bucket again. This
hook does exactly that on the simaccel device, for every bucket: a device block from the
caching allocator holds the bucket (the gradients the backward kernels produced), one
``collective.d2h`` descriptor moves it to the host staging tensor the all-reduce works on,
one ``collective.h2d`` descriptor moves the reduced values back, and the bucket DDP copies
into ``param.grad`` is read from device memory. The bytes really move, so a wrong
transfer shows up as wrong gradients.

Timing: the d2h starts on the simulated clock when the kernels queued so far (the
backward kernels that produced the bucket) are done, on the next DMA channel; the h2d
after the d2h. Backward graphs compiled later run while the bucket is in flight,
which is the overlap :func:`simaccel.distributed.collective_overlap` measures.
"""
# No ``from __future__ import annotations``: DDP checks the hook's annotations are the
# real ``dist.GradBucket`` / ``torch.futures.Future`` objects, not strings.
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from simaccel.runtime.device import Device, get_device


@dataclass
class CollectiveState:
    """The hook's state (one per DDP module): the process group (None: the default one)
    and what moved so far. ``buckets``: all-reduces issued; ``bytes``: gradient bytes sent
    (each also came back)."""

    process_group: Any = None
    device: Device | None = None
    buckets: int = 0
    bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, nbytes: int) -> None:
        with self._lock:
            self.buckets += 1
            self.bytes += nbytes


def dma_allreduce_hook(state: CollectiveState, bucket: dist.GradBucket
                       ) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook (``ddp.register_comm_hook(state, dma_allreduce_hook)``):
    the average of the bucket over the group's ranks, as DDP's default hook computes it,
    with the bucket moved off and back onto the simaccel device by DMA (see the module
    doc)."""
    device = state.device or get_device()
    flat = bucket.buffer()
    raw = _bytes_of(flat)
    block = device.allocator.malloc(raw.size)
    try:
        on_device = device.memory.view(block.offset, np.dtype(np.uint8), raw.size)
        on_device[...] = raw  # where the backward kernels left the bucket's gradients
        label = f"grad bucket {bucket.index()}"
        staging = torch.empty_like(flat)
        sent = device.dma.copy_one("collective.d2h", on_device, _bytes_of(staging), label,
                                   not_before_ns=device.dma.compute_free_ns)
        world = dist.get_world_size(state.process_group)
        staging.div_(world)
        work = dist.all_reduce(staging, group=state.process_group, async_op=True)
    except BaseException:
        device.allocator.free(block)
        raise
    state.count(raw.size)

    def bring_back(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        try:
            reduced = done.value()[0]
            device.dma.copy_one("collective.h2d", _bytes_of(reduced), on_device, label,
                                not_before_ns=sent)
            raw[...] = on_device  # DDP copies the bucket into each param.grad
            return flat
        finally:
            device.allocator.free(block)

    return work.get_future().then(bring_back)


def _bytes_of(tensor: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor as a uint8 numpy view (any dtype, bf16 too)."""
    return tensor.detach().view(torch.uint8).numpy().reshape(-1)

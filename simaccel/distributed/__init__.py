"""Data-parallel training on simulated devices: one device per rank (process), DDP's
gradient buckets all-reduced through each device's DMA engine, a local launcher.

``DDP(torch.compile(model, backend="simaccel"))`` works as it is: Dynamo's DDPOptimizer
splits the graph at bucket boundaries, every split is a simaccel graph, and the backend
attaches :func:`dma_allreduce_hook` to the DDP module (:mod:`.attach`). Figures:
``dma_stats()["collective.d2h.bytes"]`` and :func:`collective_overlap`.
"""
from simaccel.distributed.attach import attach, attach_active, collective_state
from simaccel.distributed.hook import CollectiveState, dma_allreduce_hook
from simaccel.distributed.launch import free_port, init_from_env, shutdown, spawn
from simaccel.distributed.overlap import collective_overlap, merge_traces

__all__ = ["CollectiveState", "attach", "attach_active", "collective_overlap",
           "collective_state", "dma_allreduce_hook", "free_port", "init_from_env",
           "merge_traces", "shutdown", "spawn"]

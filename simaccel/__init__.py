"""simaccel: a simulated accelerator backend for ``torch.compile``.

``torch.compile(model, backend="simaccel")`` lowers the graph to fused Numba
kernels that run on a simulated device (memory arena, caching allocator, DMA
engine), lifts Python scalars into device inputs so new values never recompile,
and lets the backend and its users add guards of their own.
"""
from __future__ import annotations

from simaccel import errors
from simaccel.guards.added import Guard
from simaccel.guards.dynamo import register_torch_logs
from simaccel.report import CompileReport, clear_reports, reports
from simaccel.runtime.config import DeviceConfig
from simaccel.runtime.device import Device, configure, get_device
from simaccel.timers import compile_times
from simaccel.codegen.tiered import wait_for_kernels  # noqa: E402 - after torch's prims load

__version__ = "0.1.0"

# The "simaccel" log answers to TORCH_LOGS / torch._logging.set_logs like torch's own.
register_torch_logs()

__all__ = ["CompileReport", "Device", "DeviceConfig", "Guard", "clear_reports", "compile_times",
           "configure", "errors", "explain", "get_device", "reports", "wait_for_kernels"]


def explain(fn, *args, **kwargs) -> list[CompileReport]:
    """Compile ``fn`` with simaccel, run it once on ``args`` and return its reports."""
    import torch

    before = len(reports())
    compiled = torch.compile(fn, backend="simaccel", options=kwargs.pop("options", None))
    compiled(*args, **kwargs)
    return reports()[before:]

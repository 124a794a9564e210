"""Errors raised by simaccel.

Every error names what was wrong and what to do about it. All derive from
:class:`SimAccelError`, so ``except simaccel.errors.SimAccelError`` catches them.
"""
from __future__ import annotations


class SimAccelError(RuntimeError):
    """Base class of every error simaccel raises on purpose."""


class InvalidOptionError(SimAccelError, ValueError):
    """An option, config field, guard or pattern given by the user is not valid."""


class UnsupportedOpError(SimAccelError):
    """An operator cannot run on the device and ``fallback="error"`` forbids the host path."""

    def __init__(self, op: str, reason: str):
        self.op = op
        self.reason = reason
        super().__init__(
            f"{op} cannot run on the simaccel device: {reason}. "
            f"Use options={{'fallback': 'host'}} to run it on the host instead."
        )


class DeviceOutOfMemoryError(SimAccelError, MemoryError):
    """The device arena cannot hold a requested allocation, even after freeing cached blocks."""

    def __init__(self, requested_bytes: int, free_bytes: int, largest_free_block: int,
                 capacity_bytes: int):
        self.requested_bytes = requested_bytes
        self.free_bytes = free_bytes
        self.largest_free_block = largest_free_block
        self.capacity_bytes = capacity_bytes
        super().__init__(
            f"simaccel device out of memory: tried to allocate {requested_bytes} bytes; "
            f"{free_bytes} bytes free of {capacity_bytes}, largest free block "
            f"{largest_free_block} bytes. Use smaller inputs or raise the device memory with "
            f"simaccel.configure(memory_bytes=...)."
        )


class KernelIndexError(SimAccelError, IndexError):
    """A device kernel found an index out of range (a gather, embedding, ``index``,
    ``index_select`` or scatter whose index tensor holds a value outside the dimension it
    indexes), where eager PyTorch raises too. The kernel stopped before reading or writing
    outside its buffer; the device and the next call are unaffected."""

    def __init__(self, detail: str = ""):
        super().__init__(
            "simaccel: an index is out of range for the dimension it indexes (eager "
            "PyTorch raises here too); check the index tensor's values"
            + (f" ({detail})" if detail else ""))


class KernelCompileError(SimAccelError):
    """Numba failed to compile a generated kernel (a simaccel bug: please report it)."""


class GuardCheckError(SimAccelError):
    """A backend-added guard's check raised while Dynamo evaluated the frame's guards."""


class CacheDirectoryError(SimAccelError):
    """The cache directory (``SIMACCEL_CACHE_DIR``) is not private to the user.

    It holds code that simaccel executes, so a directory another user owns or can write to
    is refused rather than trusted.
    """


class DistributedError(SimAccelError):
    """A rank of a distributed job failed, or the job ran past its timeout."""

"""Tiered kernels: a graph's first calls need not wait for numba.

A kernel missing from the cache is sent to the compile workers (:mod:`.compile_pool`) and,
until they are done, launches its tier-0 form (:mod:`.emit_numpy`: the same kernel IR as
whole-array numpy, built in microseconds) on the same device buffers. The first launch
after the worker finished loads the compiled kernel from the cache (a native object, a
few milliseconds) and every launch from then on runs it; programs bind their launches
again then (:func:`simaccel.runtime.tiers.bump`), so a group of native kernels becomes
one command list as usual. A kernel a warm process finds in the cache but only numba can
load (one that runs in numba's thread pool has no native object, and importing numba
takes ~0.5 s) also starts in tier 0 and is loaded when the first call returns.

Both tiers compute the same IR with the same dtypes; what can differ is a float sum's
association (numpy adds pairwise, the compiled loop in order: ``numpy_lib.fold``); an op
the compiled kernel leaves to libm calls the same C function per element in tier 0
(``numpy_lib.libm``). A tier-0 form that fails at run time (an index a select would have skipped) is
logged and the launch waits for the compiled kernel instead: a tier never changes a
result's correctness, only when the kernel is fast.

``runtime_stats()``: ``tier0_launches`` (launches that ran the tier-0 form),
``tier0_kernels`` (kernels that started in tier 0), ``tier0_waits`` (launches that
waited for the compiler).
"""
from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import logging
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from simaccel.codegen import compile_pool, numpy_lib
from simaccel.errors import KernelIndexError
from simaccel.guards.dynamo import megacache
from simaccel.runtime import tiers
from simaccel.runtime.group import bind_launch
from simaccel.runtime.sizes import SIZE_FUNCTIONS

log = logging.getLogger("simaccel.codegen")

#: seconds a launch waits for a compile it cannot run without
WAIT_S = 900.0

#: tiered kernels whose compiled form has not been loaded yet
_IN_FLIGHT: "weakref.WeakSet[TieredKernel]" = weakref.WeakSet()


def wait_for_kernels() -> int:
    """Block until every kernel compiling in the background is compiled and loaded, so
    that the next launches run compiled code (for timing steady-state calls right after a
    first compile); returns how many there were."""
    waiting = list(_IN_FLIGHT)
    for kernel in waiting:
        kernel.wait(counted=False)
    return len(waiting)


# the Mega-Cache records a kernel when it is loaded: a save waits for those still compiling
megacache.add_before_save(wait_for_kernels)


@functools.lru_cache(maxsize=4096)
def load_tier0(source: str) -> Callable[..., None]:
    """The ``kernel`` function a tier-0 module ``source`` defines (built once per source)."""
    namespace: dict[str, Any] = {"np": np, "lib": numpy_lib, **SIZE_FUNCTIONS}
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    exec(compile(source, f"<simaccel tier-0 {digest}>", "exec"), namespace)  # noqa: S102
    return namespace["kernel"]


class TieredKernel:
    """A kernel that launches its tier-0 form until ``pending`` (the worker's compile)
    is done, then the compiled kernel ``load()`` returns. ``pending`` None: tier 0 only
    (the ``tier0="only"`` option), the compiled kernel is loaded only if the tier-0 form
    fails."""

    def __init__(self, name: str, tier0: Callable[..., None],
                 pending: concurrent.futures.Future | None, load: Callable[[], Any],
                 device: Any):
        self.name = name
        self.tier0 = tier0
        self.pending = pending
        self._load = load
        self.device = device
        self.compiled: Callable[..., Any] | None = None
        device.count("tier0_kernels")
        if pending is not None:
            _IN_FLIGHT.add(self)

    def ready(self) -> bool:
        """True once the compiled kernel is loaded (loads it if the worker is done)."""
        if self.compiled is None and self.pending is not None and self.pending.done():
            self._switch()
        return self.compiled is not None

    def _switch(self) -> None:
        try:
            if self.pending is not None:
                self.pending.result()
        except Exception as exc:  # the load below compiles here and raises a real error
            log.warning("simaccel: the compile worker failed on kernel %s (%s); compiling "
                        "it in this process", self.name, exc)
        self.compiled = self._load()
        _IN_FLIGHT.discard(self)
        tiers.bump()

    def wait(self, counted: bool = True) -> None:
        """Block until the compiled kernel is loaded (``counted``: as a launch that waited,
        in ``tier0_waits``)."""
        if self.compiled is None:
            if counted:
                self.device.count("tier0_waits")
            compile_pool.release_deferred()  # its compile may still be queued
            try:
                if self.pending is not None:
                    self.pending.result(timeout=WAIT_S)
            except Exception:  # noqa: BLE001 - _switch reports it and compiles here
                pass
            self._switch()

    def __call__(self, *args: Any) -> Any:
        if self.ready():
            return self.compiled(*args)
        try:
            with np.errstate(all="ignore"):
                self.tier0(*args)
        except KernelIndexError:  # the data's fault, not the tier-0 form's: as compiled
            raise
        except Exception as exc:  # noqa: BLE001 - the compiled kernel is the reference
            log.info("simaccel: tier-0 form of kernel %s failed (%s: %s); waiting for its "
                     "compiled version", self.name, type(exc).__name__, exc)
            self.wait()
            return self.compiled(*args)
        self.device.count("tier0_launches")
        return None

    def bind(self, *args: Any, addresses: Any = None) -> Callable[[], Any]:
        """The compiled kernel's own binding once it is loaded; until then a call of this
        kernel (programs bind again when a kernel switches tiers)."""
        if self.ready():
            return bind_launch(self.compiled, list(args), addresses)
        return functools.partial(self, *args)

    def __getattr__(self, name: str) -> Any:
        # native_bind / command_list / array_slots of the compiled kernel, for launch
        # groups: absent (AttributeError) while the kernel runs in tier 0
        if name in ("native_bind", "command_list", "array_slots") \
                and "pending" in self.__dict__ \
                and self.ready():
            return getattr(self.compiled, name)
        raise AttributeError(name)

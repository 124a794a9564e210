"""numba-only kernels launched through their machine code, as native kernels are.

A kernel that runs in numba's thread pool (a ``prange`` loop) or needs numba's runtime is
not exported as a native object (:mod:`simaccel.codegen.native`), so it ran through
numba's dispatcher: ~8 us of argument typing per launch (measured: a 4-array optimizer
update, 37 us by the dispatcher, 29 us by its machine code), and a launch group holding
one could not become a command list (an SGD step's six updates: six dispatches a step).

Once numba has compiled (or loaded from its cache) such a kernel in this process, its
machine code is there to call: the function numba's dispatcher calls after typing the
arguments, in numba's calling convention (a return slot, an exception slot, seven values
per array). :class:`NumbaEntryKernel` calls it so, with the arguments converted once per
bound launch as :class:`~simaccel.codegen.native.NativeKernel` does, and hands it to a
command list the same way (its entries say which convention to call with). The address
is this process's only: nothing is written to disk.

Only kernels compiled ``nogil`` qualify (numba runs those without the GIL too, which is
what a foreign call does), with flat C arrays first and int64 scalars after (the entry
ABI); any other stays on the dispatcher.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable

from simaccel.codegen import native
from simaccel.codegen.native_call import STATUS_EXCEPTION, kernel_error


class NumbaEntryKernel(native.NativeKernel):
    """``kernel(*arrays, *ints)`` by numba's compiled function at ``address`` (numba's
    calling convention); a plain call goes through ``dispatcher`` (the same code, and
    numba's own error messages), a bound launch and a command list through the
    address."""

    def __init__(self, dispatcher: Any, address: int, signature: tuple[str, ...]):
        super().__init__(None, address, signature)
        self._dispatcher = dispatcher
        #: bytes per element of each array argument: numba's array struct carries it
        self._itemsizes = tuple(dtype.itemsize for dtype in self._np_dtypes)

    def __call__(self, *args: Any) -> None:
        self._dispatcher(*args)

    def _entry(self, c_args: tuple) -> tuple:
        """As :meth:`NativeKernel._entry`; the entry also carries the arrays' item sizes,
        which tell a command list to call in numba's convention."""
        return (self._address, c_args, self._itemsizes)

    def _launch(self, args: tuple, entry: tuple) -> Callable[[], None]:
        """A zero-argument launch in numba's convention on ``entry``'s C arguments (its
        pointer objects themselves: a patch of one is seen by the next launch)."""
        c_args = entry[1]
        ret = (ctypes.c_int64 * 8)()
        exc = ctypes.c_void_p(0)
        call = [ctypes.cast(ret, ctypes.c_void_p), ctypes.cast(ctypes.pointer(exc),
                                                                ctypes.c_void_p)]
        call += numba_arguments(c_args, self._itemsizes)
        fn, keep = self._fn, (ret, exc)

        def launch() -> None:
            status = fn(*call)
            if status == STATUS_EXCEPTION or status > 0:
                raise kernel_error(status)
        launch.slots = keep  # type: ignore[attr-defined]  # the return and exception slots
        return native.patchable(launch, args, entry)


_NULL = ctypes.c_void_p(0)


def numba_arguments(c_args: tuple, itemsizes: tuple[int, ...]) -> list[Any]:
    """``c_args`` (a pointer and a length per array, then the ints) as numba passes them:
    per array its meminfo and parent (null: the caller owns the memory), length, item
    size, data, shape and stride (bytes)."""
    out: list[Any] = []
    for j, size in enumerate(itemsizes):
        data, length = c_args[2 * j], c_args[2 * j + 1]
        item = ctypes.c_int64(size)
        out += [_NULL, _NULL, length, item, data, length, item]
    return out + list(c_args[2 * len(itemsizes):])


def entry_kernel(dispatcher: Any, numba_sig: tuple, signature: tuple[str, ...]
                 ) -> NumbaEntryKernel | None:
    """The :class:`NumbaEntryKernel` of ``dispatcher``'s compiled overload for
    ``numba_sig`` (type names ``signature``), or None where it does not qualify (see the
    module doc) or numba does not say where its code is."""
    if not dispatcher.targetoptions.get("nogil") or not native.exportable(signature):
        return None
    try:
        result = dispatcher.overloads[numba_sig]
        address = result.library.get_pointer_to_function(result.fndesc.mangled_name)
    except Exception:  # noqa: BLE001 - a numba without these: the dispatcher runs it
        return None
    if not address:
        return None
    return NumbaEntryKernel(dispatcher, address, signature)

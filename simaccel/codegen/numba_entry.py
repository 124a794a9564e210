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
command list the same way (its entry spells numba's arguments out). The address
is this process's only: nothing is written to disk.

Only kernels compiled ``nogil`` qualify (numba runs those without the GIL too, which is
what a foreign call does), with flat C arrays first and int64 scalars after (the entry
ABI); any other stays on the dispatcher.
"""
from __future__ import annotations

import ctypes
from typing import Any

from simaccel.codegen import native


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
        """The command-list entry of a launch on ``c_args`` (a pointer and a length per
        array, then the ints) in numba's convention: a return and an exception slot of
        the launch's own, then per array its meminfo and parent (null: the caller owns
        the memory), length, item size, data, shape and stride (bytes), then the ints.
        The pointer objects are ``c_args``' own, so a patch of one is seen (the casts
        keep the slots alive)."""
        ret, exc = (ctypes.c_int64 * 8)(), ctypes.c_void_p(0)
        call = [ctypes.cast(ret, ctypes.c_void_p),
                ctypes.cast(ctypes.pointer(exc), ctypes.c_void_p)]
        for j, size in enumerate(self._itemsizes):
            data, length = c_args[2 * j], c_args[2 * j + 1]
            item = ctypes.c_int64(size)
            call += [_NULL, _NULL, length, item, data, length, item]
        return (self._address, (*call, *c_args[2 * len(self._itemsizes):]))

    @staticmethod
    def array_slots(count: int) -> list[int]:
        """Positions of the first ``count`` arrays' data pointers among a launch's C
        arguments (:meth:`_entry`: two slots, then seven values per array, the data
        fifth)."""
        return [2 + 7 * j + 4 for j in range(count)]


#: a null pointer (an array's meminfo and parent)
_NULL = ctypes.c_void_p(0)


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

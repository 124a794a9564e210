"""Native command lists: one machine-code function that calls a recorded sequence of
kernel entries in order, launched by one foreign call instead of one per kernel (~1-3 us
each, more right after a GEMM left the caches cold), as a CUDA graph launches its kernel
nodes.

An entry is ``(address, C arguments[, convention])``. Its C arguments are ctypes
objects (``c_void_p`` pointers, ``c_int64`` ints) that the list reads at every launch
from where they live, as a CUDA graph's kernel nodes keep parameters that can be
updated: a launch patched to a new array (a host-mapped gradient, at a new address every
step) stores the address in its pointer object, and the list, built once, calls with it.
The conventions:

- none: a function returning a numba status (``i32 f(ptr | i64, ...)``): a simaccel
  native entry, or numba's own compiled function, whose convention its entry spells out
  (:class:`~simaccel.codegen.numba_entry.NumbaEntryKernel`);
- :data:`VOID`: a BLAS routine, every argument an address, nothing returned;
- :data:`ROWS`: ``(dst, src, rows, row bytes)``, the row at ``src`` copied into each of
  ``rows`` rows at ``dst`` (a GEMM's bias, before the product is added to it).
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from simaccel.codegen.native_call import STATUS_EXCEPTION, kernel_error, new_target_machine

#: an entry's convention: a BLAS routine (every argument a pointer, no status)
VOID = "void"
#: an entry's convention: one row copied into each row of a block
ROWS = "rows"


def command_list(calls: Sequence[tuple]) -> Callable[[], None]:
    """One native function calling each entry of ``calls`` in order; it stops at the
    first that raises (a numba status -1 or >= 1), whose index is then
    ``launch.failed_entry()``. Built with llvmlite's MCJIT without optimisation (a list
    is loads and calls: ~3 ms for 56 entries, ~25 optimised), so the runtime records one
    for launches it runs again and again. The launch keeps ``calls`` (the C
    arguments it reads) alive."""
    import llvmlite.binding as llvm

    failed = np.full(1, -1, dtype=np.int64)
    ir = command_list_ir(calls, failed.ctypes.data)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(ir), new_target_machine(opt=0))
    engine.finalize_object()
    fn = ctypes.CFUNCTYPE(ctypes.c_int32)(engine.get_function_address("sk_commands"))

    def launch() -> None:
        status = fn()
        if status == STATUS_EXCEPTION or status > 0:
            raise kernel_error(status)
    launch.engine = engine  # type: ignore[attr-defined]  # owns the code
    launch.calls = list(calls)  # type: ignore[attr-defined]  # the C arguments it reads
    launch.failed_entry = lambda: int(failed[0])  # type: ignore[attr-defined]
    return launch


def command_list_ir(calls: Sequence[tuple], failed_at: int) -> str:
    """LLVM IR of :func:`command_list`: per entry, its arguments loaded from their ctypes
    objects' memory, then the call; a failing status stores the entry's index at address
    ``failed_at`` (an int64) and returns."""
    ir = _IR()
    for k, (address, c_args, *convention) in enumerate(calls):
        kind = convention[0] if convention else None
        if kind == ROWS:
            ir.rows(k, [ir.load(a) for a in c_args])
        elif kind == VOID:
            args = ", ".join(f"ptr {ir.load(a)}" for a in c_args)
            ir.lines += [f"  %f{k} = inttoptr i64 {address} to ptr",
                         f"  call void %f{k}({args})"]
        else:
            args = [f"{'ptr' if isinstance(a, ctypes.c_void_p) else 'i64'} {ir.load(a)}"
                    for a in c_args]
            ir.status_call(k, address, args, failed_at)
    return ir.text()


class _IR:
    """The body of ``sk_commands`` as it is emitted (see :func:`command_list_ir`)."""

    def __init__(self) -> None:
        self.lines = ["define i32 @sk_commands() {", "entry:"]
        self.values = 0
        #: the block being emitted (a loop's phi names its predecessor)
        self.block = "entry"

    def load(self, arg: Any) -> str:
        """The current value of ctypes object ``arg``, loaded from its memory: ``%pN``
        (a pointer) for a ``c_void_p``, ``%vN`` (an i64) otherwise."""
        n = self.values
        self.values += 1
        self.lines += [f"  %a{n} = inttoptr i64 {ctypes.addressof(arg)} to ptr",
                       f"  %v{n} = load i64, ptr %a{n}, align 8"]
        if isinstance(arg, ctypes.c_void_p):
            self.lines.append(f"  %p{n} = inttoptr i64 %v{n} to ptr")
            return f"%p{n}"
        return f"%v{n}"

    def status_call(self, k: int, address: int, args: list[str], failed_at: int) -> None:
        """Call entry ``k``; a numba exception status stores ``k`` and returns it."""
        self.lines += [f"  %f{k} = inttoptr i64 {address} to ptr",
                       f"  %r{k} = call i32 %f{k}({', '.join(args)})",
                       f"  %neg{k} = icmp eq i32 %r{k}, {STATUS_EXCEPTION}",
                       f"  %pos{k} = icmp sgt i32 %r{k}, 0",
                       f"  %bad{k} = or i1 %neg{k}, %pos{k}",
                       f"  br i1 %bad{k}, label %fail{k}, label %ok{k}",
                       f"fail{k}:", f"  %at{k} = inttoptr i64 {failed_at} to ptr",
                       f"  store i64 {k}, ptr %at{k}, align 8", f"  ret i32 %r{k}",
                       f"ok{k}:"]
        self.block = f"ok{k}"

    def rows(self, k: int, values: list[str]) -> None:
        """Entry ``k`` of :data:`ROWS`: a loop copying the row ``src`` into ``rows``
        consecutive rows from ``dst`` (``values``: dst, src, rows, row bytes)."""
        dst, src, rows, nbytes = values
        self.lines += [f"  %empty{k} = icmp sle i64 {rows}, 0",
                       f"  br i1 %empty{k}, label %done{k}, label %row{k}",
                       f"row{k}:",
                       f"  %i{k} = phi i64 [0, %{self.block}], [%next{k}, %row{k}]",
                       f"  %off{k} = mul i64 %i{k}, {nbytes}",
                       f"  %to{k} = getelementptr i8, ptr {dst}, i64 %off{k}",
                       f"  call void @llvm.memcpy.p0.p0.i64(ptr %to{k}, ptr {src}, "
                       f"i64 {nbytes}, i1 false)",
                       f"  %next{k} = add i64 %i{k}, 1",
                       f"  %more{k} = icmp slt i64 %next{k}, {rows}",
                       f"  br i1 %more{k}, label %row{k}, label %done{k}",
                       f"done{k}:"]
        self.block = f"done{k}"

    def text(self) -> str:
        return "\n".join([*self.lines, "  ret i32 0", "}",
                          "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)"]) + "\n"


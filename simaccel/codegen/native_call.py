"""How simaccel calls machine code it made: the status a kernel entry returns, the error
that status becomes, and the JIT target machine that code is built for. Shared by the
native kernels (:mod:`.native`) and the command lists calling them (:mod:`.commands`)."""
from __future__ import annotations

from typing import Any

from simaccel.errors import KernelIndexError, SimAccelError

#: numba's status codes: 0 ok, -2 ok returning None; -1 and >= 1 are exceptions.
STATUS_EXCEPTION = -1


def kernel_error(status: int) -> SimAccelError:
    """The error of a native kernel that returned numba exception ``status``: a raised
    exception (>= 1) comes from the one check a kernel makes, its index bounds
    (:func:`simaccel.codegen.emit.with_index_check`)."""
    if status > 0:
        return KernelIndexError(f"numba status {status}")
    return SimAccelError(f"native kernel raised (numba status {status})")


def new_target_machine(opt: int = 3) -> Any:
    """A JIT target machine for the host CPU, with optimising codegen unless ``opt`` says
    otherwise (a command list, only loads and calls, takes 3 ms at 0, ~25 at 3)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
        opt=opt, codemodel="jitdefault", jit=True)

"""Kernels as native objects that a later process loads without numba.

Importing numba and setting up its compiler costs ~0.8 s per process, more than the
rest of a warm compile together. So when numba compiles a kernel, the machine code is
also exported: the kernel's optimised LLVM module gets a C-ABI entry point
``sk_entry(ptr, len, ..., int64 ...)`` (each flat array as data pointer and element
count), everything else is internalised and dropped, and the result is emitted as an
object file. A later process loads that object with llvmlite's MCJIT (tens of ms)
and calls the entry through ctypes.

Only self-contained kernels are exported: every symbol the object leaves undefined
must resolve in the process itself (libm, libc), never in numba's runtime, so
parallel kernels (numba's threading layer) and kernels needing the NRT stay numba-only.
The loader checks the symbols again before handing the object to LLVM, because an
unresolved symbol there aborts the process.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import operator
import platform
import re
import struct
import sys
import threading
from typing import Any, Callable

import numpy as np

from simaccel.codegen.commands import command_list
from simaccel.codegen.native_call import STATUS_EXCEPTION, kernel_error, new_target_machine

#: bump when the entry ABI or the file layout changes.
FORMAT = 1
MAGIC = b"simaccel-native-kernel\n"
ENTRY = "sk_entry"
_ARRAY = re.compile(r"array\((\w+), 1d, C\)$")
#: a 1-d C array arrives in numba's calling convention as these 7 values
#: (meminfo, parent, nitems, itemsize, data, shape[0], strides[0]).
_ARRAY_ABI = ("ptr", "ptr", "i64", "i64", "ptr", "i64", "i64")


def array_dtype(arg: str) -> str | None:
    """The element dtype of a signature entry ``array(<dtype>, 1d, C)``, else None."""
    match = _ARRAY.match(arg)
    return match.group(1) if match else None


def exportable(signature: tuple[str, ...]) -> bool:
    """Flat C arrays first, then int64 scalars: the entry ABI this module knows."""
    kinds = ["a" if array_dtype(a) else ("i" if a == "int64" else "?") for a in signature]
    return "?" not in kinds and kinds == sorted(kinds)  # "a" < "i": arrays first


def host_tag(signature: tuple[str, ...], numba_version: str) -> str:
    """Key of an object for this signature on this CPU with these compilers."""
    facts = [FORMAT, list(signature), numba_version, *_host_facts()]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _host_facts() -> tuple[str, ...]:
    """What the machine code depends on: llvmlite's version, the platform and the CPU
    (model and feature flags). Read from the OS's description where there is one:
    loading LLVM to ask it costs ~18 ms of a cold first call, and a cold first call
    only needs the tag to find that no object exists yet."""
    import llvmlite

    described = _described_cpu()
    if described is not None:
        return (llvmlite.__version__, sys.platform, platform.machine(), *described)
    import llvmlite.binding as llvm

    return (llvmlite.__version__, llvm.get_process_triple(), llvm.get_host_cpu_name(),
            llvm.get_host_cpu_features().flatten())


#: /proc/cpuinfo fields naming the CPU and its features (x86 and ARM spellings)
_CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags",
               "CPU implementer", "CPU architecture", "CPU variant", "CPU part",
               "CPU revision", "Features")


def _described_cpu(path: str = "/proc/cpuinfo") -> tuple[str, ...] | None:
    """The first CPU's identifying fields in ``path`` ("name: value" lines), or None
    when it has no feature list (not Linux, or an unknown layout)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            first_cpu = fh.read().split("\n\n", 1)[0]
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in first_cpu.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    if not fields.get("flags") and not fields.get("Features"):
        return None
    return tuple(f"{name}={fields[name]}" for name in _CPU_FIELDS if name in fields)


# --------------------------------------------------------------------------- export


def export_object(llvm_ir: str, kernel_symbol: str, signature: tuple[str, ...]) -> bytes | None:
    """The file content (header + object code) of the kernel ``kernel_symbol`` in
    ``llvm_ir`` (numba's optimised module), or None when it is not self-contained."""
    import llvmlite.binding as llvm

    if not exportable(signature):
        return None
    module = llvm.parse_assembly(llvm_ir)
    kernel = module.get_function(kernel_symbol)
    if not _matches_abi([str(a.type) for a in kernel.arguments], signature):
        return None
    entry = llvm.parse_assembly(_entry_ir(kernel_symbol, signature))
    entry.triple, entry.data_layout = module.triple, module.data_layout
    module.link_in(entry)
    _define_unreachable_dtor(module)
    _keep_only_entry(module)
    if any(g.name.startswith("_ZN08NumbaEnv") for g in module.global_variables):
        return None  # needs numba's runtime environment (Python objects)
    if not all(_resolvable(f.name) for f in module.functions
               if f.is_declaration and not f.name.startswith("llvm.")):
        return None  # calls into numba's runtime (NRT, threading layer, helpers)
    code = _target_machine().emit_object(module)
    symbols = undefined_symbols(code)
    if symbols is None or not all(_resolvable(s) for s in symbols):
        return None
    header = {"entry": ENTRY, "signature": list(signature), "undefined": symbols,
              "sha256": hashlib.sha256(code).hexdigest()}
    return MAGIC + json.dumps(header).encode() + b"\n" + code


def _matches_abi(arg_types: list[str], signature: tuple[str, ...]) -> bool:
    expected = ["ptr", "ptr"]  # return slot, exception info
    for arg in signature:
        expected += list(_ARRAY_ABI) if array_dtype(arg) else ["i64"]
    return arg_types == expected


def _entry_ir(kernel_symbol: str, signature: tuple[str, ...]) -> str:
    """LLVM IR of ``i32 sk_entry(ptr d0, i64 n0, ..., i64 p0, ...)`` calling the kernel
    with numba's calling convention; returns numba's status code."""
    import numpy as np

    params, call = [], ["ptr %ret", "ptr %exc"]
    for k, arg in enumerate(signature):
        dtype = array_dtype(arg)
        if dtype is None:
            params.append(f"i64 %p{k}")
            call.append(f"i64 %p{k}")
            continue
        size = np.dtype(dtype).itemsize
        params += [f"ptr %d{k}", f"i64 %n{k}"]
        call += ["ptr null", "ptr null", f"i64 %n{k}", f"i64 {size}", f"ptr %d{k}",
                 f"i64 %n{k}", f"i64 {size}"]
    arg_types = ", ".join(c.split(" ")[0] for c in call)
    return (f'declare i32 @"{kernel_symbol}"({arg_types})\n\n'
            f"define i32 @{ENTRY}({', '.join(params)}) {{\n"
            "entry:\n"
            "  %ret = alloca [8 x i64], align 16\n"
            "  %exc = alloca ptr, align 8\n"
            "  store ptr null, ptr %exc, align 8\n"
            f'  %status = call i32 @"{kernel_symbol}"({", ".join(call)})\n'
            "  ret i32 %status\n"
            "}\n")


#: numba's NRT_decref frees a meminfo whose count reaches 0 through this runtime function
_DTOR = "NRT_MemInfo_call_dtor"


def _define_unreachable_dtor(module: Any) -> None:
    """Give the kernel a no-op ``NRT_MemInfo_call_dtor`` if it references one.

    A kernel that calls a helper which may raise (the scalar ``logf`` behind
    ``lib.vlog``) keeps numba's incref/decref of its array arguments. The entry passes
    every array with a null meminfo, and NRT_incref/NRT_decref return at once on null,
    so the destructor is unreachable; defining it keeps such kernels exportable instead
    of numba-only (which costs a numba import in every process that loads them)."""
    import llvmlite.binding as llvm

    if not any(f.name == _DTOR and f.is_declaration for f in module.functions):
        return
    stub = llvm.parse_assembly(f"define void @{_DTOR}(ptr %meminfo) {{\n  ret void\n}}\n")
    stub.triple, stub.data_layout = module.triple, module.data_layout
    module.link_in(stub)


def _keep_only_entry(module: Any) -> None:
    """Internalise everything but the entry and drop what it does not reach (numba's
    Python wrappers and their references to numba's runtime)."""
    for fn in module.functions:
        if not fn.is_declaration and fn.name != ENTRY:
            fn.linkage = "internal"
    for var in module.global_variables:
        if not var.is_declaration:
            var.linkage = "internal"
    passes, builder = _dce_passes()
    passes.run(module, builder)


def undefined_symbols(code: bytes) -> list[str] | None:
    """Names an ELF64 little-endian object leaves undefined; None for other formats."""
    if code[:4] != b"\x7fELF" or code[4] != 2 or code[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", code, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", code, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", code, shoff + i * shentsize)
                for i in range(shnum)]
    names = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strtab = sections[link][4]
        for pos in range(offset + entsize, offset + size, entsize):  # entry 0 is null
            name_off, _, _, shndx = struct.unpack_from("<IBBH", code, pos)
            if shndx == 0 and name_off:
                end = code.index(b"\0", strtab + name_off)
                names.append(code[strtab + name_off:end].decode())
    return sorted(set(names))


_PROCESS: list[ctypes.CDLL] = []


def _resolvable(symbol: str) -> bool:
    """Whether the process itself (not numba's extension modules) defines ``symbol``."""
    if not _PROCESS:
        _PROCESS.append(ctypes.CDLL(None))
    try:
        getattr(_PROCESS[0], symbol)
    except AttributeError:
        return False
    return True


# --------------------------------------------------------------------------- load

_LOCK = threading.Lock()
_TM: list[Any] = []
_PASSES: list[Any] = []


def _dce_passes() -> tuple[Any, Any]:
    """Global dead-code elimination (one pass manager for the process)."""
    with _LOCK:
        if not _PASSES:
            import llvmlite.binding as llvm

            passes = llvm.ModulePassManager()
            passes.add_global_dead_code_eliminate_pass()
            passes.add_strip_dead_prototype_pass()
            tuning = llvm.create_pipeline_tuning_options()
            _PASSES.extend([passes, llvm.create_pass_builder(_target_machine_locked(), tuning)])
        return _PASSES[0], _PASSES[1]


def _target_machine() -> Any:
    """The process's target machine for exports (never handed to an engine)."""
    with _LOCK:
        return _target_machine_locked()


def _target_machine_locked() -> Any:
    if not _TM:
        _TM.append(new_target_machine())
    return _TM[0]


def load_object(blob: bytes, signature: tuple[str, ...]) -> NativeKernel | None:
    """A callable for an exported object, or None if the file is not a sound export
    for ``signature`` on this process (the caller then compiles with numba)."""
    import llvmlite.binding as llvm

    if not blob.startswith(MAGIC):
        return None
    try:
        head, code = blob[len(MAGIC):].split(b"\n", 1)
        header = json.loads(head)
    except ValueError:
        return None
    if (header.get("entry") != ENTRY or tuple(header.get("signature", ())) != signature
            or header.get("sha256") != hashlib.sha256(code).hexdigest()
            or not all(_resolvable(s) for s in header.get("undefined", ["?"]))):
        return None
    # the engine takes ownership of (and frees) its target machine: give it its own
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), new_target_machine())
    engine.add_object_file(llvm.ObjectFileRef.from_data(code))
    engine.finalize_object()
    address = engine.get_function_address(ENTRY)
    if not address:
        return None
    return NativeKernel(engine, address, signature)


class NativeKernel:
    """``kernel(*arrays, *ints)`` through the object's C entry. The C arguments of the
    last call are kept with its arguments (which keeps the arrays, and so the pointers,
    alive): a program launches each kernel on the same device views every call, and
    then a launch costs one identity check and the foreign call."""

    def __init__(self, engine: Any, address: int, signature: tuple[str, ...]):
        self._engine = engine  # owns the code
        self._dtypes = [array_dtype(a) for a in signature if array_dtype(a)]
        #: the same as numpy dtypes: compared per argument at every bind (numpy's
        #: ``dtype.name`` is a Python property, ~4 us a call)
        self._np_dtypes = [np.dtype(d) for d in self._dtypes]
        self._nargs = len(signature)
        self._address = address
        self._fn = ctypes.CFUNCTYPE(ctypes.c_int32)(address)  # arguments come as ctypes
        #: (arguments, their C form), replaced as one tuple: thread safe
        self._bound: tuple[tuple, tuple] = ((), ())

    def __call__(self, *args: Any) -> None:
        bound = self._bound
        if len(args) != len(bound[0]) or not all(map(operator.is_, args, bound[0])):
            bound = self._bound = (args, self._c_arguments(args))
        status = self._fn(*bound[1])
        if status == STATUS_EXCEPTION or status > 0:
            raise kernel_error(status)

    def bind(self, *args: Any, addresses: Any = None) -> Callable[[], None]:
        """A zero-argument launch on ``args`` with their C form made now (the runtime binds
        each kernel once per workspace and size tuple: its device views do not change
        between calls). ``addresses``: each array argument's data address (bytes) where
        the caller knows it (None entries are read from the array; ~4 us each)."""
        return self._launch(args, self._entry(self._c_arguments(args, addresses)))

    def native_bind(self, *args: Any, addresses: Any = None
                    ) -> tuple[Callable[[], None], tuple[int, tuple]]:
        """:meth:`bind` and the launch's (entry address, C arguments), for a command list
        (:func:`.commands.command_list`), from one conversion of ``args``; the launch keeps
        ``args`` alive."""
        entry = self._entry(self._c_arguments(args, addresses))
        return self._launch(args, entry), entry

    def _entry(self, c_args: tuple) -> tuple:
        """The command-list entry of a launch on ``c_args`` (:mod:`.commands`)."""
        return (self._address, c_args)

    def _launch(self, args: tuple, entry: tuple) -> Callable[[], None]:
        """A zero-argument launch of command-list ``entry`` (address, C arguments of
        ``args``) by a foreign call."""
        fn, c_args = self._fn, entry[1]

        def launch() -> None:
            status = fn(*c_args)
            if status == STATUS_EXCEPTION or status > 0:
                raise kernel_error(status)
        return patchable(launch, args, entry, self.array_slots(len(self._dtypes)))

    #: builds a command list of launches' entries (a launch group's)
    command_list = staticmethod(command_list)

    @staticmethod
    def array_slots(count: int) -> list[int]:
        """Positions of the first ``count`` array arguments' pointers among a launch's C
        arguments (:meth:`_c_arguments`: a pointer and a length per array, then the
        ints): a launch group patches them when an array moves."""
        return [2 * j for j in range(count)]

    def _c_arguments(self, args: tuple, addresses: Any = None) -> tuple:
        if len(args) != self._nargs:
            raise TypeError(f"kernel takes {self._nargs} arguments, got {len(args)}")
        c_args: list[Any] = []
        for k, arg in enumerate(args):
            if k >= len(self._dtypes):
                c_args.append(ctypes.c_int64(int(arg)))
                continue
            if arg.dtype != self._np_dtypes[k] or arg.ndim != 1 or not arg.flags.c_contiguous:
                raise TypeError(f"kernel expects a flat C-contiguous {self._dtypes[k]} array, "
                                f"got {arg.dtype.name} of shape {arg.shape}")
            address = addresses[k] if addresses is not None else None
            c_args += [ctypes.c_void_p(arg.ctypes.data if address is None else address),
                       ctypes.c_int64(arg.shape[0])]
        return tuple(c_args)


def patchable(launch: Callable[[], None], args: tuple, entry: tuple,
              slots: list[int]) -> Callable[[], None]:
    """``launch`` (reading the C arguments of ``args`` in command-list ``entry`` at every
    call; array ``j``'s data pointer at ``slots[j]``) keeping the arrays alive, with
    ``launch.commands``, its entries (a replay joins them into one command list:
    :mod:`simaccel.runtime.sequence`), and ``launch.patch(position, array, address)``:
    array argument
    ``position`` pointed at ``array`` (data address ``address``, bytes; the dtype and size
    it was bound with, checked by the caller) by storing the address in its C pointer,
    as a CUDA graph's kernel node takes new parameters. A host-mapped argument at a new
    address every call (a gradient, a new tensor every step) is then one store, not a
    new binding of every argument."""
    kept = list(args)
    c_args = entry[1]

    def patch(position: int, array: Any, address: int) -> None:
        c_args[slots[position]].value = address
        kept[position] = array
    launch.arrays = kept  # type: ignore[attr-defined]  # keeps the pointers valid
    launch.patch = patch  # type: ignore[attr-defined]
    launch.patched_by_address = True  # type: ignore[attr-defined]  # the array is kept only
    launch.commands = (entry,)  # type: ignore[attr-defined]
    launch.build_commands = command_list  # type: ignore[attr-defined]
    return launch

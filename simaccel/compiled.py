"""The callable a compiled graph becomes: host tensors in, device program, host tensors out."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.fx

from simaccel.codegen.compile import STORAGE_DTYPES
from simaccel.codegen.ir import contiguous_strides
from simaccel.device_plan import is_device_resident
from simaccel.runtime.program import Program


class CompiledGraph:
    """The callable AOTAutograd runs for one forward or backward graph (boxed calling
    convention: it receives the argument list and clears it)."""

    _boxed_call = True

    def __init__(self, program: Program, output_meta: list[Any], scalar_outputs: dict[int, Any],
                 resident: set[int] | None = None, report: Any = None):
        self.program = program
        self.output_meta = output_meta
        #: (shape, stride, dtype) of each tensor output, None for Python values
        self._out_specs = [_output_spec(m) for m in output_meta]
        self.scalar_outputs = scalar_outputs
        #: argument indices kept resident (parameters); None: detect at the first call
        self.resident: set[int] | None = resident
        #: the graph's CompileReport (None for graphs compiled outside the backend)
        self.report = report
        #: argument indices fed to the constant bank (lifted scalars, 0-d inputs)
        self._scalar_indices = frozenset(i for i, _ in program.spec.scalar_inputs)

    def __call__(self, args: list[Any]) -> list[Any]:
        if self.resident is None:
            # Parameters, buffers and static-address inputs stay on the device.
            self.resident = {i for i, a in enumerate(args) if is_device_resident(a)}
            self.program.set_resident_inputs(self.resident)
        keys = {i: _content_key(args[i]) for i in self.resident} if self.resident else None
        host_args, data_ptrs = _host_arrays(args, self._scalar_indices)
        outputs = [None if spec is None else torch.empty_strided(spec[0], spec[1], dtype=spec[2])
                   for spec in self._out_specs]
        self.program.run(host_args, [None if o is None else _numpy_view(o) for o in outputs],
                         keys, data_ptrs)
        for index, value in self.scalar_outputs.items():
            outputs[index] = value(args) if callable(value) else value
        args.clear()
        return outputs


    def call_unboxed(self, *args: Any) -> list[Any]:
        """Dynamo's calling convention (positional arguments), for graphs Dynamo calls
        directly, without AOTAutograd's runtime wrapper."""
        return self(list(args))


def _content_key(t: torch.Tensor) -> tuple:
    """Identifies a tensor's current contents: the same object, storage and version
    counter means the device copy is still valid (an in-place update bumps the version)."""
    return (id(t), t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()))


def _host_arrays(args: list[Any], scalar_indices: frozenset[int] = frozenset()
                 ) -> tuple[list[Any], list[int]]:
    """Host arrays of the arguments (Python values pass through) and each tensor's data
    address (bytes; 0 for non-tensors), for the program's DMA alignment check. This runs on
    every call, so plain CPU tensors (the common case) take a short path. A 0-d tensor at
    one of ``scalar_indices`` (a lifted float Dynamo wraps per call) only feeds the
    constant bank, which packs its value: it is passed as that Python number (``item()``
    is exact for every dtype the bank holds, and ~1 us cheaper than a numpy view)."""
    host_args = []
    data_ptrs = []
    for i, a in enumerate(args):
        if i in scalar_indices and type(a) is torch.Tensor and a.dim() == 0 \
                and a.dtype in _BANK_DTYPES:
            host_args.append(a.item())
            data_ptrs.append(0)
        elif type(a) is torch.Tensor and not a.requires_grad and a.dtype in _PLAIN_DTYPES:
            host_args.append(a.numpy())
            data_ptrs.append(a.data_ptr())
        else:
            host_args.append(_host_array(a))
            data_ptrs.append(a.data_ptr() if isinstance(a, torch.Tensor) else 0)
    return host_args, data_ptrs


def _host_array(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.dtype in _NUMPY_DTYPES and t.device.type == "cpu" and not (t.is_conj() or t.is_neg()):
            return t.numpy()  # the common case, kept short: this runs for every input
        if t.device.type != "cpu":
            raise TypeError(f"simaccel takes CPU tensors as host inputs, got {t.device}")
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        if str(t.dtype).replace("torch.", "") in STORAGE_DTYPES:
            t = t.view(torch.int16)
        return t.numpy()
    return value


_NUMPY_DTYPES = {torch.float32, torch.float64, torch.int32, torch.int64, torch.bool,
                 torch.int8, torch.uint8, torch.int16, torch.float16, torch.complex64,
                 torch.complex128}


#: dtypes of 0-d inputs passed to the constant bank as Python numbers (``item()`` is exact)
_BANK_DTYPES = {torch.float64, torch.float32, torch.int64, torch.int32, torch.bool}

#: dtypes whose plain (non-conjugate, non-negative-view) tensors ``.numpy()`` always takes
_PLAIN_DTYPES = _NUMPY_DTYPES - {torch.complex64, torch.complex128}


def _output_spec(meta: Any) -> tuple | None:
    """(shape, stride, dtype) to allocate a host output like eager's (its strides when they
    are dense, contiguous otherwise)."""
    if not isinstance(meta, torch.Tensor):
        return None
    shape = tuple(int(s) for s in meta.shape)
    try:
        stride = tuple(int(s) for s in meta.stride())
        if _dense_strides(list(shape), list(stride)):
            return shape, stride, meta.dtype
    except Exception:  # strides unavailable (e.g. symbolic): contiguous is always valid
        pass
    return shape, contiguous_strides(shape), meta.dtype


def _dense_strides(shape: list[int], stride: list[int]) -> bool:
    """True if (shape, stride) covers exactly prod(shape) elements without overlap."""
    dims = sorted((s, n) for s, n in zip(stride, shape) if n != 1)
    expected = 1
    for s, n in dims:
        if s != expected:
            return False
        expected *= n
    return True


def _numpy_view(t: torch.Tensor) -> np.ndarray:
    if t.dtype in _NUMPY_DTYPES:
        return t.numpy()
    if str(t.dtype).replace("torch.", "") in STORAGE_DTYPES:
        return t.view(torch.int16).numpy()
    return t.numpy()


def scalar_outputs(gm: torch.fx.GraphModule) -> dict[int, Any]:
    """Outputs that are Python values (ints, SymInts, None), not tensors."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    result: dict[int, Any] = {}
    for index, node in enumerate(flat):
        meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else node
        if isinstance(meta, torch.Tensor):
            continue
        if isinstance(node, torch.fx.Node) and node in placeholders:
            pos = placeholders.index(node)
            result[index] = lambda args, pos=pos: args[pos]
        elif isinstance(meta, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            result[index] = _concrete(meta)
        else:
            result[index] = meta
    return result


def _concrete(value: Any) -> Any:
    node = getattr(value, "node", None)
    if node is not None and hasattr(node, "hint") and node.hint is not None:
        return node.hint
    return value

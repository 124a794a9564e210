"""Lower an ATen FX graph to kernel IR: the device partition and the host fallbacks.

:class:`GraphLowering` walks the graph once. Each node goes through its lowering
(:mod:`simaccel.codegen.lowering`); pointwise results stay :class:`Lazy` and fuse into
their users; reductions, templates and graph outputs are realized into buffers. A
node without a lowering (or with a dtype the device lacks) becomes a
:class:`HostOp`: its operands are copied to the host, torch runs it, the results are
copied back.
"""
from __future__ import annotations

import logging
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from simaccel.codegen.dtypes import DEVICE_DTYPES, HALF_DTYPES, storage_name, torch_to_np_dtype
from simaccel.codegen.fusion import fuse_pointwise_launches, fuse_sibling_reductions
from simaccel.codegen.fusion_rows import fuse_rows
from simaccel.codegen.gemm_pairs import pair_gemms
from simaccel.codegen.input_views import input_view_outputs
from simaccel.codegen.inplace import inplace_writebacks
from simaccel.codegen.hostop import HostOp
from simaccel.codegen.ir import (ExternKernel, Kernel, Layout, PointwiseKernel, ReductionKernel,
                                 contiguous_strides, count_ops)
from simaccel.codegen.registry import LOWERINGS, OWN_DTYPES
from simaccel.codegen.sizes import Size, is_value, prod, shape_of, size, symbol_names
from simaccel.codegen.values import Lazy, Realized, TensorValue, cast
from simaccel.errors import UnsupportedOpError

log = logging.getLogger("simaccel.codegen")
aten = torch.ops.aten

#: a lazy value whose element costs more scalar ops than this is realized when it
#: has several users, instead of being recomputed in each of them.
INLINE_MAX_OPS = 12


class Unsupported(Exception):
    """Raised by a lowering that cannot handle this node; the node runs on the host."""


@dataclass
class BufferSpec:
    """A device buffer of a lowered graph. kind: input, scalar, constant, temp, output."""

    name: str
    dtype: str
    numel: int
    kind: str


@dataclass
class InputSpec:
    """Graph input ``index``: a tensor (shape, dtype) or a Python scalar (``scalar``)."""

    index: int
    buffer: str
    shape: tuple[Size, ...]
    dtype: str
    scalar: bool = False
    #: the placeholder's example value (a FakeTensor, SymInt or number)
    value: Any = None


@dataclass
class LoweredGraph:
    buffers: dict[str, BufferSpec]
    steps: list[Kernel | HostOp]
    inputs: list[InputSpec]
    outputs: list[Any]  # Realized, a Python scalar, or None, per graph output
    output_meta: list[Any]
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    #: input mutations the graph keeps (AOTAutograd's ``copy_(input, value)``): per
    #: mutated input, its argument index and its new value (contiguous, the input's
    #: shape and dtype), written back into the caller's tensor at the end of a call
    writebacks: list[tuple[int, Realized]] = field(default_factory=list)
    #: runtime assertions on sizes (``_assert_scalar``): (condition as a size expression,
    #: message), checked once per new size tuple
    size_asserts: list[tuple[str, str]] = field(default_factory=list)
    #: write-backs computed in place: new value's buffer -> the input's buffer, which the
    #: program uses for both (:mod:`simaccel.codegen.inplace`)
    aliases: dict[str, str] = field(default_factory=dict)
    #: outputs that are views of inputs, made on the host (never computed): output
    #: position -> ``(args) -> view`` (:mod:`simaccel.codegen.input_views`)
    input_views: dict[int, Any] = field(default_factory=dict)


class GraphLowering:
    """Lowers one ATen graph. ``fallback``: "host" or "error"."""

    def __init__(self, gm: torch.fx.GraphModule, fallback: str = "host",
                 scalar_dtypes: dict[int, str] | None = None):
        self.gm = gm
        self.fallback = fallback
        #: constant-bank dtype of int scalar inputs by placeholder index (int32 slots)
        self.scalar_dtypes = dict(scalar_dtypes or {})
        self.env: dict[torch.fx.Node, Any] = {}
        self.buffers: dict[str, BufferSpec] = {}
        self.steps: list[Kernel | HostOp] = []
        self.inputs: list[InputSpec] = []
        self.fallbacks: list[tuple[str, str]] = []
        self.current: torch.fx.Node | None = None
        self.constants: dict[str, torch.Tensor] = {}  # get_attr tensors by buffer
        #: argument index of each tensor placeholder node
        self.placeholder_index: dict[torch.fx.Node, int] = {}
        self.writebacks: dict[int, Realized] = {}
        self.size_asserts: list[tuple[str, str]] = []
        #: id of a lazy value -> (it, its shared realization): :meth:`realize_shared`
        self._shared: dict[int, tuple[Lazy, Realized]] = {}

    # ------------------------------------------------------------------ buffers

    def new_buffer(self, dtype: str, numel: Size, kind: str = "temp", prefix: str = "buf") -> str:
        name = f"{prefix}{len(self.buffers)}"
        self.buffers[name] = BufferSpec(name, dtype, size(numel), kind)
        return name

    def new_tensor(self, shape: tuple[Size, ...], dtype: str, kind: str = "temp") -> Realized:
        shape = shape_of(shape)
        name = self.new_buffer(dtype, prod(shape), kind)
        return Realized(shape, dtype, Layout(name, shape, contiguous_strides(shape), 0))

    def add_kernel(self, kernel: Kernel) -> None:
        """Append ``kernel``; a pointwise or reduction kernel that writes no element is
        dropped (nothing to compute, and no numba compile for an empty loop)."""
        if isinstance(kernel, PointwiseKernel) and is_value(kernel.numel, 0):
            return
        if isinstance(kernel, ReductionKernel) and is_value(kernel.out.numel, 0):
            return
        self.steps.append(kernel)

    def kernel_name(self, kind: str) -> str:
        target = self.current.target if self.current is not None else kind
        op = getattr(target, "__name__", str(target)).split(".")[0]
        return f"{kind}_{len(self.steps)}_{op}"

    # ------------------------------------------------------------------ realization

    def realize(self, value: TensorValue) -> Realized:
        if isinstance(value, Realized):
            return value
        out = self.new_tensor(value.shape, value.dtype)
        self.realize_into(value, out)
        return out

    def realize_into(self, value: TensorValue, out: Realized) -> None:
        """Compute ``value`` into the (possibly strided) tensor ``out``."""
        index = [f"i{k}" for k in range(len(out.shape))]
        body = cast(value.load(index), out.dtype)  # the store converts from the body's dtype
        self.add_kernel(PointwiseKernel(self.kernel_name("pointwise"), out.layout, body, index))

    def realize_contiguous_copy(self, value: TensorValue) -> Realized:
        """A new contiguous buffer holding ``value`` (for ops that then write into it)."""
        out = self.new_tensor(value.shape, value.dtype)
        self.realize_into(value, out)
        return out

    def realize_shared(self, value: TensorValue) -> Realized:
        """``value`` in a contiguous buffer, computed once per lazy value however many
        consumers ask (GEMMs reading a gradient as it is and transposed). The buffer is
        read only: a consumer writing into its operand takes
        :meth:`realize_contiguous_copy`."""
        if not isinstance(value, Lazy):
            return self.realize_contiguous(value)
        held = self._shared.get(id(value))
        if held is None:  # the lazy value is held too: its id stays its own
            held = self._shared[id(value)] = (value, self.realize_contiguous(value))
        return held[1]

    def realize_contiguous(self, value: TensorValue) -> Realized:
        if isinstance(value, Realized) and value.is_contiguous():
            return value
        out = self.new_tensor(value.shape, value.dtype)
        self.realize_into(value, out)
        return out

    # ------------------------------------------------------------------ node info

    def meta(self, node: torch.fx.Node) -> Any:
        return node.meta.get("val")

    def out_dtype(self, node: torch.fx.Node | None = None) -> str:
        val = self.meta(node or self.current)
        if isinstance(val, (list, tuple)):
            val = val[0]
        dtype = torch_to_np_dtype(val.dtype)
        if dtype is None:
            raise Unsupported(f"dtype {val.dtype} is not a device dtype")
        return dtype

    def out_shape(self, node: torch.fx.Node | None = None) -> tuple[Size, ...]:
        val = self.meta(node or self.current)
        if isinstance(val, (list, tuple)):
            val = val[0]
        return shape_of(val.shape)

    # ------------------------------------------------------------------ walking

    def run(self, example_inputs: list[Any]) -> LoweredGraph:
        outputs: list[Any] = []
        views = input_view_outputs(self.gm)  # views of inputs: made on the host
        placeholders = 0
        for node in self.gm.graph.nodes:
            self.current = node
            if node.op == "placeholder":
                self.env[node] = self._placeholder(node, placeholders, example_inputs)
                self.placeholder_index[node] = placeholders
                placeholders += 1
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "get_attr":
                self.env[node] = self._constant(node)
            elif node.op == "output":
                outputs = [None if k in views else self._output(v)
                           for k, v in enumerate(_flat_outputs(node.args[0]))]
        self.current = None
        metas = [self.meta(v) if isinstance(v, torch.fx.Node) else v
                 for v in _flat_outputs(next(iter(reversed(self.gm.graph.nodes))).args[0])]
        self.steps = pair_gemms(fuse_pointwise_launches(fuse_rows(fuse_sibling_reductions(
            self.steps))), self.buffers)
        writebacks = sorted(self.writebacks.items(), key=lambda kv: kv[0])
        aliases = inplace_writebacks(self.steps, writebacks, {
            s.index: s.buffer for s in self.inputs if s.index >= 0 and not s.scalar})
        return LoweredGraph(self.buffers, self.steps, self.inputs, outputs, metas, self.fallbacks,
                            self.constants, writebacks, self.size_asserts, aliases, views)

    def _placeholder(self, node: torch.fx.Node, index: int, example_inputs: list[Any]) -> Any:
        val = self.meta(node)
        if val is None and index < len(example_inputs):
            val = example_inputs[index]
        if isinstance(val, torch.Tensor):
            dtype = storage_name(val.dtype)
            if dtype is None:
                raise UnsupportedOpError("graph input", f"dtype {val.dtype} cannot be stored "
                                         f"on the device")
            # 0-d tensors (lifted Python floats arrive as 0-d float64) go to the constant
            # bank: one coalesced transfer per call, and none when no value changed.
            scalar = val.dim() == 0 and dtype in DEVICE_DTYPES
            value = self.new_tensor(shape_of(val.shape), dtype,
                                    kind="scalar" if scalar else "input")
            self.inputs.append(InputSpec(index, value.layout.buffer, value.shape, dtype, scalar,
                                         val))
            return value
        if isinstance(val, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            dtype = _scalar_dtype(val)
            if dtype == "int64":
                dtype = self.scalar_dtypes.get(index, dtype)
            value = self.new_tensor((), dtype, kind="scalar")
            self.inputs.append(InputSpec(index, value.layout.buffer, (), dtype, True, val))
            # An int is a size (or a lifted int): lowerings see it as the SymInt itself, so
            # shapes stay symbolic; its value reaches the device through the constant bank
            # and kernels take it as a launch argument.
            return size(val) if isinstance(val, (int, torch.SymInt)) and \
                not isinstance(val, bool) else value
        return val

    def _constant(self, node: torch.fx.Node) -> Any:
        attr = getattr(self.gm, node.target)
        if not isinstance(attr, torch.Tensor):
            return attr
        dtype = storage_name(attr.dtype)
        if dtype is None:
            raise UnsupportedOpError("graph constant", f"dtype {attr.dtype} cannot be stored "
                                     f"on the device")
        value = self.new_tensor(shape_of(attr.shape), dtype, kind="constant")
        self.inputs.append(InputSpec(-1, value.layout.buffer, value.shape, dtype))
        self.constants[value.layout.buffer] = attr.detach().contiguous()
        return value

    def _output(self, value: Any) -> Any:
        value = self.env.get(value, value) if isinstance(value, torch.fx.Node) else value
        if isinstance(value, TensorValue):
            # a lazy value a GEMM read already is in a buffer: computing it again into
            # another (a training forward's saved activation) would read its operands
            # twice, and a trained bias read twice is uploaded instead of mapped
            held = self._shared.get(id(value))
            return held[1] if held is not None else self.realize(value)
        return value

    def _call(self, node: torch.fx.Node) -> Any:
        args = torch.fx.node.map_arg(node.args, lambda n: self.env[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: self.env[n])
        if node.target is operator.getitem:
            return args[0][args[1]]
        if _mutates_input(node):
            return self._input_mutation(node, args, kwargs)
        symbolic = _symbolic_int(self.meta(node))
        if symbolic is not None:
            return symbolic  # size arithmetic (sym_size, operator.mul...): no kernel
        lowering = LOWERINGS.get(node.target)
        reason = "no device lowering for this op" if lowering is None else \
            None if node.target in OWN_DTYPES else _dtype_problem(node)
        if reason is None:
            try:
                result = lowering(self, *args, **kwargs)
                return self._maybe_realize(node, result)
            except Unsupported as exc:
                reason = str(exc)
        return self._host(node, args, kwargs, reason)

    def _input_mutation(self, node: torch.fx.Node, args: Any, kwargs: Any) -> Realized:
        """``copy_(input, value)``, the input mutation AOTAutograd keeps in the graph
        (``keep_inference_input_mutations``): the value is computed into a buffer of the
        input's shape and dtype and written back into the caller's tensor after the
        call's last kernel (no output, no copy by AOTAutograd's epilogue). Later reads
        of the input in the graph see the new value. Any other op mutating a graph
        input (``set_``, ``resize_``) has no device form: a host copy cannot mutate
        the caller's tensor, so it is an error, never a silent fallback."""
        dst_node = node.args[0]
        if node.target is not aten.copy_.default:
            raise UnsupportedOpError(str(node.target), "it mutates a graph input in a way "
                                     "the device cannot write back (only copy_ can); "
                                     "compile without it or use another backend")
        dst, value = args[0], args[1]
        if not (isinstance(value, Realized) and value.dtype == dst.dtype):
            value = LOWERINGS[aten.copy.default](self, dst, value, **kwargs)
        if tuple(value.shape) != tuple(dst.shape):
            value = LOWERINGS[aten.expand.default](self, value, list(dst.shape))
        if isinstance(value, Realized) and value.is_contiguous() and value.dtype == dst.dtype \
                and self.buffers[value.layout.buffer].kind == "temp" \
                and is_value(value.layout.offset, 0):
            new = value  # computed into a buffer of its own already: written back from there
        else:
            new = self.new_tensor(dst.shape, dst.dtype)
            self.realize_into(value, new)  # the store converts to the input's dtype
        self.writebacks[self.placeholder_index[dst_node]] = new
        self.env[dst_node] = new
        return new

    def _maybe_realize(self, node: torch.fx.Node, result: Any) -> Any:
        if isinstance(result, Lazy) and len(node.users) > 1:
            if count_ops(result.load([f"i{k}" for k in range(result.ndim)]),
                         INLINE_MAX_OPS + 1) > INLINE_MAX_OPS:
                return self.realize(result)
        return result

    def _host(self, node: torch.fx.Node, args: Any, kwargs: Any, reason: str) -> Any:
        name = str(node.target)
        if self.fallback == "error":
            raise UnsupportedOpError(name, reason)
        log.info("host fallback for %s: %s", name, reason)
        self.fallbacks.append((name, reason))
        args = _map_values(args, self.realize)
        kwargs = _map_values(kwargs, self.realize)
        val = self.meta(node)
        metas = list(val) if isinstance(val, (list, tuple)) else [val]
        used = _used_results(node, len(metas))
        # a result nothing reads gets no buffer: the host op's own kernel may give it
        # another size than its meta function (embedding_bag's offset2bag in bf16)
        outs = [self._host_output(m) if k in used else None for k, m in enumerate(metas)]
        self.steps.append(HostOp(self.kernel_name("host"), node.target, args, kwargs, outs, reason))
        return outs if isinstance(val, (list, tuple)) else outs[0]

    def _host_output(self, meta: Any) -> Realized | None:
        if not isinstance(meta, torch.Tensor):
            return None
        dtype = storage_name(meta.dtype)
        if dtype is None:
            raise UnsupportedOpError(str(self.current.target),
                                     f"its result dtype {meta.dtype} has no device layout")
        return self.new_tensor(shape_of(meta.shape), dtype)


def _mutates_input(node: torch.fx.Node) -> bool:
    """True if ``node`` is an ATen op writing into one of the graph's placeholders."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.is_mutable:
        return False
    for arg, value in zip(schema.arguments, node.args):
        writes = arg.alias_info is not None and arg.alias_info.is_write
        if writes and isinstance(value, torch.fx.Node) and value.op == "placeholder":
            return True
    return False


def _used_results(node: torch.fx.Node, count: int) -> set[int]:
    """Indices of a multi-result node's results that some user reads (all of them unless
    every user is a ``getitem``)."""
    if count == 1 or any(u.target is not operator.getitem for u in node.users):
        return set(range(count))
    return {u.args[1] for u in node.users}


def _flat_outputs(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _map_values(obj: Any, fn) -> Any:
    if isinstance(obj, TensorValue):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_values(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map_values(v, fn) for k, v in obj.items()}
    return obj


def _symbolic_int(val: Any) -> Size | None:
    """A node's value when it is an int size expression (a SymInt or int result) over
    sizes the graph's inputs carry. An unbacked SymInt (``x.item()``) is computed on the
    device instead, by its op's lowering."""
    if type(val) is int:
        return val
    if isinstance(val, torch.SymInt) and not any(n.startswith("u") for n in symbol_names(val)):
        return size(val)
    return None


def _scalar_dtype(val: Any) -> str:
    if isinstance(val, (bool, torch.SymBool)):
        return "bool"
    if isinstance(val, (int, torch.SymInt)):
        return "int64"
    return "float64"


def _dtype_problem(node: torch.fx.Node) -> str | None:
    """Why the device cannot run ``node`` because of a dtype, or None."""
    vals = [node.meta.get("val")]
    for arg in node.all_input_nodes:
        vals.append(arg.meta.get("val"))
    for val in vals:
        for v in (val if isinstance(val, (list, tuple)) else [val]):
            if isinstance(v, torch.Tensor) and torch_to_np_dtype(v.dtype) is None:
                return f"dtype {v.dtype} is not supported by the device"
    return None


def extern(ctx: GraphLowering, source: str, buffers: list[str], params: list[Any],
           flops: int, bytes_moved: int, parallel: bool = False, *,
           writes: tuple[str, ...], numpy_source: str | None = None) -> None:
    """Append a template kernel launch (see :mod:`simaccel.codegen.templates`); ``writes``:
    the buffers its source stores to (outputs and scratch; it reads the others).
    Templates index raw elements: a 16-bit float buffer (raw bits) is never handed to one
    (its lowering computes in float32, :func:`simaccel.codegen.operands.as_compute`)."""
    if any(ctx.buffers[b].dtype in HALF_DTYPES for b in buffers):
        raise Unsupported(f"template {ctx.kernel_name('extern')} on 16-bit float buffers")
    ctx.add_kernel(ExternKernel(ctx.kernel_name("extern"), source, buffers,
                                [size(p) for p in params], size(flops), size(bytes_moved),
                                frozenset(writes), parallel, numpy_source))

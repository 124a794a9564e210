"""Lowerings to vendor-library calls on device buffers (:mod:`.library_calls`): linear
algebra, FFT, fused attention and complex-valued ops, as inductor runs them (extern ATen
calls on the device's memory; no DMA, no fusion). Also ``addbmm`` (GEMMs and a sum), and effectful
library calls (``with_effects``: linalg ops that check their inputs).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from simaccel.codegen.dtypes import storage_name, torch_to_np_dtype
from simaccel.codegen.graph import GraphLowering, Unsupported
from simaccel.codegen.ir import Layout, LibraryKernel, dense_strides
from simaccel.codegen.library_calls import LibraryCall, TensorSpec, tensor_slot
from simaccel.codegen.lower_extern import matmul
from simaccel.codegen.lower_reduce import reduce
from simaccel.codegen.lowering import elementwise
from simaccel.codegen.registry import LOWERINGS, register
from simaccel.codegen.sizes import is_symbolic
from simaccel.codegen.values import Realized, TensorValue

aten = torch.ops.aten

#: linear algebra (a LAPACK / cuSOLVER routine each)
LINALG = ["_linalg_det", "_linalg_eigh", "_linalg_eigvals", "_linalg_slogdet",
          "_linalg_solve_ex", "_linalg_svd", "cholesky", "cholesky_inverse", "cholesky_solve",
          "_cholesky_solve_helper", "linalg_cholesky_ex", "linalg_eig", "linalg_eigvals",
          "linalg_householder_product", "linalg_inv_ex", "linalg_ldl_factor_ex",
          "linalg_ldl_solve", "linalg_lu", "linalg_lu_factor_ex", "linalg_lu_solve",
          "linalg_matrix_exp", "linalg_qr", "linalg_solve_triangular", "lu_unpack", "ormqr",
          "svd", "triangular_solve", "geqrf", "linalg_pinv", "linalg_matrix_rank",
          "_linalg_check_errors"]
#: FFT (a cuFFT plan each)
FFT = ["_fft_r2c", "_fft_c2c", "_fft_c2r"]
#: ops of complex tensors: the complex arithmetic library (the device's ALUs have none)
COMPLEX = ["_conj", "_conj_physical", "conj_physical", "view_as_complex", "view_as_real",
           "polar", "complex", "angle"]
#: ops that run as usual on real tensors and as complex-library calls on complex ones
COMPLEX_AWARE = ["_to_copy", "clone", "slice", "select", "permute", "squeeze", "unsqueeze",
                 "view", "_unsafe_view", "reshape", "expand", "constant_pad_nd", "cat", "stack",
                 "add", "sub", "mul", "div", "neg", "abs", "t", "transpose", "alias",
                 "detach", "sum", "mean", "where", "copy", "flip", "roll", "real", "imag",
                 "pow", "exp", "reciprocal", "sgn", "full_like", "zeros_like", "index_select",
                 "index", "narrow", "split", "split_with_sizes", "unbind", "diagonal",
                 "as_strided", "repeat", "eq", "ne", "isnan", "fill", "lift_fresh_copy",
                 "full", "scalar_tensor", "zeros", "ones", "empty", "slice_scatter",
                 "select_scatter", "new_zeros", "new_empty", "new_full"]


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _static(shape: tuple) -> tuple[int, ...]:
    if any(is_symbolic(s) for s in shape):
        raise Unsupported("a library call on tensors of dynamic shape")
    return tuple(int(s) for s in shape)


def _operands(ctx: GraphLowering, obj: Any, specs: list[TensorSpec], buffers: list[str]) -> Any:
    """``obj`` with each tensor replaced by a slot, its layout and buffer recorded."""
    if isinstance(obj, TensorValue):
        value = obj if isinstance(obj, Realized) else ctx.realize(obj)
        lay = value.layout
        specs.append(TensorSpec(_static(value.shape), _static(lay.strides), int(lay.offset),
                                _torch_dtype(value.dtype)))
        buffers.append(lay.buffer)
        return tensor_slot()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_operands(ctx, o, specs, buffers) for o in obj)
    if isinstance(obj, dict):
        return {k: _operands(ctx, v, specs, buffers) for k, v in obj.items()}
    if is_symbolic(obj):
        raise Unsupported("a library call with a dynamic size argument")
    return obj


def library_call(ctx: GraphLowering, kind: str, op: Any, args: tuple, kwargs: dict,
                 metas: list[Any]) -> list[Realized | None]:
    """Launch ``op(*args, **kwargs)`` as a library call writing a new buffer per tensor of
    ``metas`` (the results' example values)."""
    specs: list[TensorSpec] = []
    buffers: list[str] = []
    args, kwargs = _operands(ctx, (tuple(args), dict(kwargs)), specs, buffers)
    outs: list[Realized | None] = []
    for meta in metas:
        if not isinstance(meta, torch.Tensor):
            outs.append(None)
            continue
        dtype = storage_name(meta.dtype)
        if dtype is None:
            raise Unsupported(f"a library result of dtype {meta.dtype}")
        outs.append(_result(ctx, meta, dtype))
    out_specs = [None if o is None else TensorSpec(o.shape, tuple(o.layout.strides), 0,
                                                   _torch_dtype(o.dtype)) for o in outs]
    writes = [o.layout.buffer for o in outs if o is not None]
    if not writes:  # a check (it raises on bad input): its launch writes a status word
        writes = [ctx.new_buffer("int8", 1)]
    nbytes = sum(math.prod(s.shape) * s.dtype.itemsize for s in specs + [s for s in out_specs if s])
    call = LibraryCall(op, args, kwargs, specs, out_specs, kind)
    ctx.add_kernel(LibraryKernel(ctx.kernel_name(kind), call, buffers + writes, [],
                                 _flops(specs), nbytes, writes=frozenset(writes)))
    return outs


def _result(ctx: GraphLowering, meta: torch.Tensor, dtype: str) -> Realized:
    """A new buffer for a library result, laid out as the library lays it out where that
    layout is dense (attention's (batch, query, head) order): copying the result in is
    then one sequential pass, not a transpose."""
    shape = _static(tuple(meta.shape))
    strides = _static(tuple(meta.stride()))
    if not dense_strides(shape, strides):
        return ctx.new_tensor(shape, dtype)
    name = ctx.new_buffer(dtype, math.prod(shape))
    return Realized(shape, dtype, Layout(name, shape, strides, 0))


def _flops(specs: list[TensorSpec]) -> int:
    """A cost for the roofline model: n**1.5 flops for n operand elements (matrix
    factorizations are O(n**3) in the matrix order, i.e. n**1.5 in elements)."""
    n = sum(math.prod(s.shape) for s in specs)
    return int(2 * max(n, 1) ** 1.5)


def _metas(ctx: GraphLowering) -> tuple[list[Any], bool]:
    val = ctx.meta(ctx.current)
    return (list(val), True) if isinstance(val, (list, tuple)) else ([val], False)


def _lower_as(kind: str) -> Callable:
    def lower(ctx: GraphLowering, *args: Any, **kwargs: Any) -> Any:
        metas, many = _metas(ctx)
        outs = library_call(ctx, kind, ctx.current.target, args, kwargs, metas)
        return outs if many else outs[0]
    return lower


def _packets(names: list[str]) -> list[Any]:
    return [getattr(aten, n) for n in names if hasattr(aten, n)]


register(*_packets(LINALG), own_dtypes=True)(_lower_as("linalg"))
# fused attention's backward: one library call, on static shapes with long key rows
# (simaccel.attention decomposes short rows and dynamic shapes into GEMMs); the forward
# has a module of its own (lower_attention)
register(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)(
    _lower_as("attention"))
register(*_packets(FFT), own_dtypes=True)(_lower_as("fft"))
register(*_packets(COMPLEX), own_dtypes=True)(_lower_as("complex"))


def _complex_in(node: torch.fx.Node) -> str | None:
    """"complex" if the node reads or makes a complex tensor; else why its dtypes keep
    it off the device, or None."""
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    flat = [v for val in vals for v in (val if isinstance(val, (list, tuple)) else [val])]
    tensors = [v for v in flat if isinstance(v, torch.Tensor)]
    if any(t.dtype.is_complex for t in tensors):
        return "complex"
    bad = [t.dtype for t in tensors if torch_to_np_dtype(t.dtype) is None]
    return f"dtype {bad[0]} is not supported by the device" if bad else None


def _complex_aware(original: Callable) -> Callable:
    complex_call = _lower_as("complex")

    def lower(ctx: GraphLowering, *args: Any, **kwargs: Any) -> Any:
        problem = _complex_in(ctx.current)
        if problem == "complex":
            return complex_call(ctx, *args, **kwargs)
        if problem:
            raise Unsupported(problem)
        return original(ctx, *args, **kwargs)
    return lower


def _wrap_complex_aware() -> None:
    for packet in _packets(COMPLEX_AWARE):
        for name in packet.overloads():
            overload = getattr(packet, name)
            original = LOWERINGS.get(overload)
            if original is not None:
                register(overload, own_dtypes=True)(_complex_aware(original))


@register(torch.ops.higher_order.with_effects, own_dtypes=True)
def _with_effects(ctx: GraphLowering, token: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """An effectful call (AOTAutograd threads a token through it): the token passes
    through; the op runs as a library call if it is one."""
    if LOWERINGS.get(op) is None or op not in _LIBRARY_OPS:
        raise Unsupported(f"effectful op {op}")
    metas, _ = _metas(ctx)
    outs = library_call(ctx, "linalg", op, args, kwargs, metas[1:])
    return [token, *outs]


@register(aten.addbmm.default)
def _addbmm(ctx: GraphLowering, bias: Any, a: TensorValue, b: TensorValue, *,
            beta: Any = 1, alpha: Any = 1) -> Any:
    """``beta*bias + alpha*sum_i a[i] @ b[i]``: one batched GEMM, a sum over the batch."""
    dtype = ctx.out_dtype()
    product = matmul(ctx, a, b, dtype)
    total = reduce(ctx, product, [0], False, "sum", dtype)
    scaled = total if alpha == 1 else elementwise(ctx, "mul", [total, alpha])
    if beta == 0:
        return elementwise(ctx, "identity", [scaled])
    return elementwise(ctx, "add", [bias if beta == 1 else elementwise(ctx, "mul", [bias, beta]),
                                    scaled])


_LIBRARY_OPS = {getattr(p, n) for p in _packets(LINALG + FFT) for n in p.overloads()}
_wrap_complex_aware()

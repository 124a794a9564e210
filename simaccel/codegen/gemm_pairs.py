"""Two independent small GEMMs launched as one kernel, each on a core of its own.

A linear layer's backward computes two products from the same output gradient: the
input's gradient ``g @ W`` and the weight's ``g.T @ x``. Neither reads the other, yet the
library runs them one after the other, and a small product costs mostly the library
call's fixed cost: a classifier layer's pair (64x10 @ 10x512 and 10x64 @ 64x512) takes
32-69 us as two ``torch.mm`` calls and 14 us as one launch calling the BLAS GEMM directly,
the two products at once, each single-threaded in a parallel loop of two (what a GPU
backend gets from two streams). Measured in the MLP training step of ``simaccel bench``
(256-512-512-10, batch 64; ``/tmp/s40_parts.py`` in the session notes): the backward's
kernels take 10-21 us less a step.

Large products do not pair (:data:`PAIR_MAX_MACS`): the library's own two threads serve
them nearly as well, and a pair of 64x512x512 products, 100 us faster alone, was 45 us
faster in that step on a quiet machine but 31 us slower while a neighbour loaded the
host's memory. The cap also keeps every pair below the sizes oneDNN's inner product
takes (:data:`~simaccel.codegen.library.ONEDNN_MIN_MACS`).

:func:`pair_gemms` is a pass over a lowered graph's steps: a library GEMM (2-D, float32 or
float64, static sizes) joins the GEMM just before it when it reads nothing that one
writes and writes nothing it touches, both are of the same dtype, and both sizes are in
range. Only adjacent GEMMs pair (moving one past the steps between would change which
results are ready when).

The pair is a template kernel (:class:`~simaccel.codegen.ir.ExternKernel`): compiled,
cached and tiered as any other (its tier-0 form runs both products in numpy).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from simaccel.codegen.blas_symbols import has_gemm
from simaccel.codegen.ir import ExternKernel, LibraryKernel
from simaccel.codegen.library import gemm

#: the smallest product (m * k * n multiply-adds) that joins a pair: a 64x10x512 pair
#: runs 2-5x faster as one launch than as two library calls (above)
PAIR_MIN_MACS = 1 << 16
#: the largest (see the module doc: larger pairs gain only on a quiet machine)
PAIR_MAX_MACS = 1 << 22

#: a part's launch parameters, by name (``m x k @ k x n``, the operands' element offsets,
#: whether each is stored transposed)
_PART_PARAMS = ("m", "k", "n", "a_off", "b_off", "a_t", "b_t")


def pair_gemms(steps: Sequence[Any], buffers: Mapping[str, Any]) -> list[Any]:
    """``steps`` with each pairable library GEMM joined to the one just before it
    (``buffers``: the graph's buffers by name, each with its ``dtype``); see the module
    doc."""
    out: list[Any] = []
    last_dtype = None  # the dtype of the last step kept, if it is a pairable GEMM
    for step in steps:
        dtype = _pairable_dtype(step, buffers)
        if dtype is not None and dtype == last_dtype and _independent(out[-1], step):
            out[-1] = _pair(out[-1], step, dtype)
            last_dtype = None  # a pair takes no third product
            continue
        out.append(step)
        last_dtype = dtype
    return out


def _pairable_dtype(step: Any, buffers: Mapping[str, Any]) -> str | None:
    """The dtype of a library GEMM that can run in a pair (2-D, static and non-empty
    sizes, a dtype the BLAS has, a size in range), else None."""
    if not isinstance(step, LibraryKernel) or step.fn is not gemm:
        return None
    params = step.params
    if not all(isinstance(p, int) for p in params) or params[0] != 1:
        return None
    dtype = buffers[step.buffers[0]].dtype
    _, m, k, n = params[:4]
    in_range = min(m, k, n) > 0 and PAIR_MIN_MACS <= m * k * n <= PAIR_MAX_MACS
    return dtype if in_range and has_gemm(dtype) else None


def _independent(first: LibraryKernel, second: LibraryKernel) -> bool:
    """Neither reads what the other writes, nor do they write the same buffer."""
    return not (second.reads & first.writes or second.writes & (first.reads | first.writes))


def _pair(first: LibraryKernel, second: LibraryKernel, dtype: str) -> ExternKernel:
    """The template launch running ``first`` and ``second`` at once."""
    buffers = [*first.buffers, *second.buffers]
    params = [*_part_params(first), *_part_params(second)]
    return ExternKernel(f"{first.name}_pair", pair_source(dtype), buffers, params,
                        first.flops + second.flops, first.bytes_moved + second.bytes_moved,
                        first.writes | second.writes, parallel=True,
                        numpy_source=pair_numpy_source())


def _part_params(step: LibraryKernel) -> list[int]:
    """A part's parameters (:data:`_PART_PARAMS`) from the library GEMM's."""
    _, m, k, n, a_off, _, b_off, _, a_t, b_t = step.params
    return [m, k, n, a_off, b_off, a_t, b_t]


def _arguments() -> str:
    """The kernel's arguments: each part's three buffers, then each part's parameters."""
    buffers = [f"{name}{part}" for part in (0, 1) for name in ("out", "a", "b")]
    params = [f"{name}{part}" for part in (0, 1) for name in _PART_PARAMS]
    return ", ".join(buffers + params)


def _product_call(part: int, dtype: str) -> str:
    """The BLAS call of part ``part``: row-major ``out = op(a) @ op(b)`` as the
    column-major ``out.T = op(b).T @ op(a).T`` (a matrix stored row-major is its
    transpose stored column-major)."""
    p = str(part)
    return (f"gemm(TRANSPOSED if b_t{p} else AS_STORED, TRANSPOSED if a_t{p} else AS_STORED, "
            f"n{p}, m{p}, k{p}, np.{dtype}(1.0), "
            f"b{p}.ctypes.data + b_off{p} * size, k{p} if b_t{p} else n{p}, "
            f"a{p}.ctypes.data + a_off{p} * size, m{p} if a_t{p} else k{p}, "
            f"out{p}.ctypes.data, n{p})")


def pair_source(dtype: str) -> str:
    """The pair kernel's source for ``dtype`` (numpy name; one BLAS has): a parallel loop
    of two, each iteration one product on one thread."""
    return f"""from simaccel.codegen.blas_lib import (AS_STORED, TRANSPOSED, blas_threads_local,
                                        gemm)


def kernel({_arguments()}):
    size = out0.itemsize
    for t in prange(2):
        threads = blas_threads_local(1)  # one core each: the two products at once
        if t == 0:
            {_product_call(0, dtype)}
        else:
            {_product_call(1, dtype)}
        blas_threads_local(threads)
"""


def _numpy_operand(name: str, part: int) -> str:
    """numpy source of operand ``name`` ("a": m x k, "b": k x n) of part ``part``."""
    rows, cols = ("m", "k") if name == "a" else ("k", "n")
    p = str(part)
    flat = f"{name}{p}[{name}_off{p}:{name}_off{p} + {rows}{p} * {cols}{p}]"
    return (f"({flat}.reshape(({cols}{p}, {rows}{p})).T if {name}_t{p} "
            f"else {flat}.reshape(({rows}{p}, {cols}{p})))")


def pair_numpy_source() -> str:
    """The pair kernel's tier-0 form (numpy, the same arguments): the two products in
    turn."""
    lines = [f"    np.matmul({_numpy_operand('a', p)}, {_numpy_operand('b', p)},\n"
             f"              out=out{p}[:m{p} * n{p}].reshape((m{p}, n{p})))" for p in (0, 1)]
    return f"def kernel({_arguments()}):\n" + "\n".join(lines) + "\n"

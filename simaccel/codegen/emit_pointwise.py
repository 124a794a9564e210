"""Pointwise kernels as numba source: one loop nest storing one element per iteration
(a scatter: at an index it computes), or a part and its mates sharing one nest
(:attr:`~simaccel.codegen.ir.PointwiseKernel.mates`)."""
from __future__ import annotations

from simaccel.codegen.dtypes import HALF_DTYPES
from simaccel.codegen.emit import (HALF_LOAD, RANGE_FLAG, BodyEmitter, index_source,
                                   kernel_args, kernel_module, loop_nest, parallel_loop,
                                   store_source)
from simaccel.codegen.ir import PointwiseKernel, buffers_read


def emit_pointwise(k: PointwiseKernel) -> tuple[str, list[str]]:
    """Module source and argument buffer names of a pointwise (or scatter) kernel (one
    part: fused siblings are kernels of their own, launched together, see
    :func:`simaccel.codegen.compile.assemble`)."""
    if k.siblings:
        raise ValueError(f"{k.name}: emit each part of a fused launch on its own")
    if k.mates:
        return _emit_shared_nest(k)
    args = kernel_args(k.out.buffer, [k.body, *k.store_index_exprs])
    scatter = bool(k.store_offset)
    parallel = parallel_loop(k.numel, [k.body]) and len(k.shape) > 0 and not scatter
    rerunnable = not scatter and k.out.buffer not in buffers_read([k.body])
    return kernel_module(args, parallel, lambda fast: _pointwise_nest(k, parallel, fast),
                         rerunnable), args


def _emit_shared_nest(k: PointwiseKernel) -> tuple[str, list[str]]:
    """Module source and argument buffer names of a pointwise part and its mates: one
    loop nest, each store's body and store in turn inside it (a momentum update and the
    parameter update reading it: one pass over the elements instead of two)."""
    args = shared_nest_args(k)
    outs, bodies = args[:len(k.stores)], [store.body for store in k.stores]
    parallel = parallel_loop(k.numel, bodies) and len(k.shape) > 0
    rerunnable = not set(outs) & set(buffers_read(bodies))

    # a store reading no buffer an earlier one stored shares the values computed before
    # it (the parameter update and the momentum update: ``0.9 * buf + g`` once); one
    # reading a stored element loads it again
    reuse = not any(set(buffers_read([store.body])) & set(outs[:j])
                    for j, store in enumerate(k.stores))

    def nest(fast_trig: bool) -> tuple[list[str], bool]:
        lines, indent = loop_nest(k.index, k.shape, parallel, "    ")
        shared = BodyEmitter(indent, fast_trig) if reuse else None
        emitters = []
        for j, store in enumerate(k.stores):  # temporaries named apart, or one emitter's
            body = shared or BodyEmitter(indent, fast_trig, prefix=f"s{j}t")
            start = len(body.lines)
            result = body.value(store.body)
            body.lines.append(_plain_store(store, indent, result))
            lines += body.lines[start:]
            if body not in emitters:
                emitters.append(body)
        wide = [term for body in emitters for term in body.wide_terms]
        if wide:  # one count per iteration (flag_lines): prange's reduction variable
            lines.append(f"{indent}{RANGE_FLAG} += {' + '.join(wide)}")
        return lines, any(body.range_checked for body in emitters)
    return kernel_module(args, parallel, nest, rerunnable), args


def shared_nest_args(k: PointwiseKernel) -> list[str]:
    """The argument buffers of a part and its mates' kernel: every store's output, in
    order, then the buffers only read."""
    outs = [store.out.buffer for store in k.stores]
    return outs + [b for b in buffers_read([store.body for store in k.stores])
                   if b not in outs]


def _pointwise_nest(k: PointwiseKernel, parallel: bool,
                    fast_trig: bool) -> tuple[list[str], bool]:
    lines, indent = loop_nest(k.index, k.shape, parallel, "    ")
    body, checked = pointwise_body(k, indent, fast_trig)
    return lines + body, checked


def pointwise_body(k: PointwiseKernel, indent: str, fast_trig: bool,
                   prefix: str = "t") -> tuple[list[str], bool]:
    """The statements of a pointwise kernel inside its loops (at ``indent``): its body
    and its store; and whether a fast helper's range check can fire."""
    body = BodyEmitter(indent, fast_trig, prefix=prefix)
    result = body.value(k.body)
    if k.store_offset:
        idx = [f"np.int64({body.value(e)})" for e in k.store_index_exprs]
        offset = k.store_offset.format(*idx)
        target = f"{k.out.buffer}[{index_source(offset)}]"
        store = f"{indent}{target} = {_stored(result, k.body.dtype, target, k.accumulate)}"
    else:
        store = _plain_store(k, indent, result)
    return body.lines + body.flag_lines() + [store], body.range_checked


def _plain_store(k: PointwiseKernel, indent: str, result: str) -> str:
    """The statement storing ``result`` at this iteration's element of ``k``'s output."""
    return (f"{indent}{k.out.buffer}[{index_source(k.out.offset_source(k.index))}] = "
            f"{store_source(result, k.body.dtype)}")


def _stored(result: str, dtype: str, target: str, accumulate: bool) -> str:
    """The value a scatter kernel stores at ``target``: ``result``, or ``target + result``
    when it accumulates (a 16-bit float target is loaded, added in float32, rounded)."""
    if not accumulate:
        return store_source(result, dtype)
    if dtype in HALF_DTYPES:
        return store_source(f"np.float32({HALF_LOAD[dtype]}({target}) + {result})", dtype)
    return f"{target} + {result}"

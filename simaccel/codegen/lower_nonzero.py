"""``nonzero`` on the device, once its output size is known.

Its output has one row per nonzero element, so a graph with it is staged
(:mod:`simaccel.staged`): a device stage counts the nonzero elements, the count comes
back to the host, and the next stage takes it as the size ``u0`` of this op's output.
The kernel is then a single ordered pass (row-major order, as ATen returns them) writing
each nonzero element's coordinates."""
from __future__ import annotations

import torch

from simaccel.codegen.graph import GraphLowering, Unsupported, extern
from simaccel.codegen.operands import dense
from simaccel.codegen.registry import register
from simaccel.codegen.values import TensorValue

aten = torch.ops.aten


def nonzero_source(ndim: int) -> str:
    """``kernel(out, m, N, D0..D{ndim-1})``: the coordinates of each nonzero of the dense
    ``m`` (``N`` elements, shape ``D0..``) as rows of ``out`` (int64, ``ndim`` a row)."""
    dims = ", ".join(f"D{d}" for d in range(ndim))
    lines = [f"def kernel(out, m, N, {dims}):",
             "    k = 0",
             "    for i in range(N):",
             "        if m[i] != 0:",
             "            rest = i"]
    for d in reversed(range(ndim)):
        lines.append(f"            out[k*{ndim} + {d}] = rest % D{d}")
        if d:
            lines.append(f"            rest = rest // D{d}")
    lines.append("            k += 1")
    return "\n".join(lines) + "\n"


@register(aten.nonzero.default)
def _nonzero(ctx: GraphLowering, x: TensorValue) -> TensorValue:
    """The output's row count is a size symbol the stage takes as an input (the count the
    stage before computed); ``x`` with no dims stays on the host (a lowering error)."""
    if x.ndim == 0:
        raise Unsupported("nonzero of a 0-d tensor")
    m = dense(ctx, x)
    out = ctx.new_tensor(ctx.out_shape(), "int64")
    extern(ctx, nonzero_source(x.ndim), [out.layout.buffer, m.layout.buffer],
           [x.numel, *x.shape], x.numel, 9 * x.numel, writes=(out.layout.buffer,))
    return out

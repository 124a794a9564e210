"""Active dropout on the device: a counter-based random mask, seeded once per call.

Eager's ``F.dropout(x, p, training=True)`` draws its mask from torch's default CPU
generator (mt19937, one draw per element), a host-side stream no device kernel can
follow, so an active dropout used to run as a host fallback: its operand copied off the
device and its result and mask copied back, in every training step. A device RNG works
as accelerators' do (CUDA's Philox, inductor's): each element's random bits are a hash of
(seed, dropout, element index), computed in the kernel that reads them, and the host
hands the kernels a seed per call.

:func:`seed_active_dropouts` rewrites each active dropout of Dynamo's graph, before
AOTAutograd traces it, as :func:`hash_dropout` on a new last graph input, the call's
seed (in a copy of the graph module: Dynamo reads its own graph's inputs after the backend
returns). :func:`seeded` wraps what the backend returns so that each call draws that
seed from torch's default generator (one 63-bit draw: ``torch.manual_seed`` makes runs
repeat, as it makes eager's) and passes it after Dynamo's arguments: a 0-d input, it
reaches the device in the constant bank (one 8-byte transfer per call). Dynamo never
sees the input: its guards and the frame's arguments stay as they were. The mask's bits
are one ATen op, :func:`random_bits`, which the device computes as one scalar op in the
kernel that reads it (:mod:`simaccel.codegen.lower_random`): no mask buffer in the
forward, ~20 integer operations per element.

The masks are not eager's (no backend's are: inductor's Philox differs too); what holds
is the distribution. Element ``i`` of dropout ``k`` is kept iff its 24 random bits are
below ``round((1 - p) * 2**24)`` (probability ``1 - p`` within 2**-25), and kept
elements are ``x * (1 / (1 - p))``, dropped ones ``x * 0``, eager's own arithmetic.
AOTAutograd derives the backward (the gradient times the same mask) and decides whether
to keep the mask or recompute it. A rate that is a lifted float is read from its graph
input, though Dynamo's own trace still pins its value (``native_dropout`` takes a
constant): one graph per rate, as under Dynamo's default backends.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Callable

import torch
import torch.fx

from simaccel.codegen import hash_lib
from simaccel.guards import dynamo
from simaccel.pre_aot import dropout_arguments

#: the name of the seed input the rewrite adds to Dynamo's graph
SEED_INPUT = "simaccel_dropout_seed"
#: the seed input's example while compiling (its value is never read then)
SEED_EXAMPLE = torch.zeros((), dtype=torch.int64)


@torch.library.custom_op("simaccel::random_bits", mutates_args=())
def random_bits(seed: torch.Tensor, shape: Sequence[int], stream: int) -> torch.Tensor:
    """int64 tensor of ``shape``: :data:`~simaccel.codegen.hash_lib.BITS` random bits per
    element, a hash of ``seed`` (0-d int64), ``stream`` and the element's row-major
    index (:func:`simaccel.codegen.hash_lib.random_bits`). One op in the ATen graph,
    which the device computes in the kernel that reads it."""
    index = torch.arange(math.prod(shape), dtype=torch.int64, device=seed.device)
    return hash_lib.random_bits(index.view(shape), seed, stream)


@random_bits.register_fake
def _random_bits_shape(seed: torch.Tensor, shape: Sequence[int], stream: int) -> torch.Tensor:
    return seed.new_empty(shape)


def keep_threshold(p: float) -> int:
    """The random bits' value below which an element is kept: probability ``1 - p``."""
    return round((1.0 - p) * (1 << hash_lib.BITS))


def hash_dropout(x: torch.Tensor, seed: torch.Tensor, p: Any, stream: int) -> torch.Tensor:
    """``x`` with each element zeroed with probability ``p`` and the rest scaled by
    ``1 / (1 - p)``; the mask is a hash of ``seed`` (a 0-d int64 in ``[0, 2**63)``),
    ``stream`` (which dropout of the graph) and the element's row-major index. ``p``: a
    number, or a lifted rate as its 0-d float64 tensor, read at run time (in ``[0, 1]`` by
    Dynamo's guards from ``F.dropout``'s own check; Dynamo's trace also pins its value, see
    the module doc). AOTAutograd traces it
    to :func:`random_bits` and pointwise ops, which the fuser puts in one kernel with the
    dropout's neighbours."""
    if isinstance(p, torch.Tensor):
        kept = 1.0 - p
        threshold, scale = kept * (1 << hash_lib.BITS), 1.0 / kept  # inf at 1: never read
    elif p == 1:
        return x * 0.0  # eager's x * 0 * 0
    else:  # integers: the same test in every dtype
        threshold, scale = keep_threshold(p), 1.0 / (1.0 - p)
    keep = torch.ops.simaccel.random_bits(seed, x.shape, stream) < threshold
    # eager's x * mask * scale: kept x * scale, dropped x * 0 (NaN for an inf x)
    return torch.where(keep, x * scale, x * 0.0)


def seed_active_dropouts(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list[str]]:
    """Dynamo's graph module ``gm`` with each active dropout (training the constant True,
    a constant rate ``0 < p <= 1``, not in place, on a floating tensor) rewritten as
    :func:`hash_dropout` on a seed input added after the graph's placeholders (in a copy:
    Dynamo's own graph keeps its inputs); one line per dropout rewritten. None to
    rewrite: ``gm`` itself and no lines."""
    found = [node for node in gm.graph.nodes if _active_dropout(node) is not None]
    fake_mode = getattr(found[0].meta.get("example_value"), "fake_mode", None) \
        if found else None
    if fake_mode is None:
        return gm, []
    gm = dynamo.frame_graph_copy(gm)
    seed = _seed_placeholder(gm.graph, fake_mode)
    dropouts = [(node, bound) for node in gm.graph.nodes
                if (bound := _active_dropout(node)) is not None]
    notes = []
    for stream, (node, (x, p)) in enumerate(dropouts):
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(hash_dropout, (x, seed, p, stream))
        new.meta.update(node.meta)
        rate = p.meta["example_value"] if isinstance(p, torch.fx.Node) else p
        with fake_mode:
            new.meta["example_value"] = hash_dropout(x.meta["example_value"],
                                                     seed.meta["example_value"], rate, stream)
        read = dropout_arguments(node)[1]  # a lifted rate's item(), unused once replaced
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        if isinstance(read, torch.fx.Node) and not read.users:
            gm.graph.erase_node(read)
        shown = f"{p:g}" if isinstance(p, float) else f"'{p.name}', lifted"
        notes.append(f"dropout '{node.name}' (p={shown}) as a device mask, seeded per call")
    gm.recompile()
    return gm, notes


def _active_dropout(node: torch.fx.Node) -> tuple[torch.fx.Node, Any] | None:
    """(input node, p: a number, or the 0-d tensor node a lifted rate is read from) of a
    dropout ``node`` this module rewrites, else None."""
    bound = dropout_arguments(node)
    if bound is None:
        return None
    x, p, training, inplace = bound
    value = x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None
    if training is not True or inplace or not isinstance(value, torch.Tensor) \
            or not value.is_floating_point():
        return None
    if type(p) in (int, float):
        return (x, float(p)) if 0 < p <= 1 else None
    # a lifted float: ``.item()`` of the 0-d tensor Dynamo passes it in
    read = isinstance(p, torch.fx.Node) and p.op == "call_method" and p.target == "item" \
        and isinstance(p.args[0], torch.fx.Node)
    tensor = p.args[0].meta.get("example_value") if read else None
    if isinstance(tensor, torch.Tensor) and tensor.ndim == 0 and tensor.is_floating_point():
        return x, p.args[0]
    return None


def _seed_placeholder(graph: torch.fx.Graph, fake_mode: Any) -> torch.fx.Node:
    """The 0-d int64 seed placeholder after the graph's last one, with its example."""
    seed = dynamo.backend_placeholder(graph, SEED_INPUT)
    seed.meta["example_value"] = fake_mode.from_tensor(SEED_EXAMPLE)
    return seed


def draw_seed() -> torch.Tensor:
    """A fresh 0-d int64 seed in ``[0, 2**63)`` from torch's default generator."""
    return torch.empty((), dtype=torch.int64).random_()


def seeded(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` (what the backend returns for a rewritten graph) with each call's seed
    drawn and passed after Dynamo's arguments. A new tensor per call: AOTAutograd may
    keep the forward's seed for the backward."""
    def with_seed(*args: Any) -> Any:
        return call(*args, draw_seed())
    return with_seed


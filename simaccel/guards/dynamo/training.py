"""A training graph called without AOTAutograd's runtime wrapper.

AOTAutograd runs a compiled training graph inside its ``CompiledFunction`` (an
``autograd.Function``) behind a chain of runtime wrappers: input mutations and aliased
outputs, deduplicated and merged inputs, effect tokens, functionalized RNG, tensor
subclasses, saved sizes, tangent layouts, the lazily compiled backward. A graph that has
none of these needs only what any ``autograd.Function`` does: run the forward, save what
the backward reads, mark the outputs that need no gradient, and run the backward on the
saved tensors and the incoming gradients. :class:`TrainingCall` does that (measured on
the MLP training step of ``simaccel bench``: ~100 us a step less than AOTAutograd's path,
forward and backward together, Dynamo's own frame overhead unchanged).

Which graphs: :func:`training_call` reads AOTAutograd's ``ViewAndMutationMeta`` (private)
inside the forward compiler and names the reason when the wrapper is needed. The first
steps still go through AOTAutograd: it compiles the backward lazily, at the first
``backward()``; from the next call on, once the backward graph is compiled and its inputs
line up (:meth:`TrainingCall.backward_compiled`), calls take the direct way.

The graph's inputs are the frame's arguments (after the frame module's own parameters and
buffers, which AOTAutograd passes first); its outputs are the user outputs, then the
tensors saved for the backward. The backward graph takes the saved tensors, then the
gradients of the outputs that need one (``tangents``), contiguous as they were traced;
it returns a gradient (or None) per forward input. A second backward through it raises,
as AOTAutograd's does.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.autograd.function import once_differentiable

from simaccel.guards.dynamo.aot import frame_call_reason, metadata_reason, module_held
from simaccel.guards.dynamo.values import has_symbolic_layout

__all__ = ["TrainingCall", "TrainingSpec", "training_spec"]


@dataclass(frozen=True)
class TrainingSpec:
    """How a training graph's forward and backward line up (see the module doc):
    ``held``, the frame module's tensors passed first; ``outputs``, the number of user
    outputs; ``non_differentiable``, the user outputs that need no gradient;
    ``tangents``, the user outputs whose gradients the backward takes, in its order;
    ``inputs``, the forward graph's input count."""

    held: tuple[torch.Tensor, ...]
    outputs: int
    non_differentiable: tuple[int, ...]
    tangents: tuple[int, ...]
    inputs: int


def training_spec(frame_gm: torch.fx.GraphModule, graph: torch.fx.GraphModule,
                  frame_inputs: int, autocast: bool) -> TrainingSpec | str:
    """The :class:`TrainingSpec` of the training forward graph AOTAutograd is compiling,
    or why it needs AOTAutograd's runtime wrapper. Call it inside the forward compiler."""
    from torch._functorch._aot_autograd.schemas import MutationType
    from torch._guards import TracingContext
    meta = getattr(TracingContext.try_get(), "fw_metadata", None)
    if meta is None:
        return "AOTAutograd gave no graph metadata"
    held = module_held(frame_gm)
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    reason = frame_call_reason(frame_gm, autocast) or metadata_reason(meta)
    if reason is None and len(placeholders) != len(held) + frame_inputs:
        reason = "the graph's inputs are not the frame's (deduplicated or merged inputs)"
    if reason is None and any(i.mutation_type != MutationType.NOT_MUTATED
                              for i in meta.input_info):
        reason = "the graph mutates an input"
    if reason is None:
        reason = _layout_reason(meta, placeholders, graph)
    if reason is not None:
        return reason
    info = meta.output_info
    return TrainingSpec(
        held, len(info), tuple(i for i, o in enumerate(info) if not o.requires_grad),
        tuple(i for i, o in enumerate(info) if o.requires_grad_for_backward),
        len(placeholders))


def _layout_reason(meta: Any, placeholders: Sequence[torch.fx.Node],
                   graph: torch.fx.GraphModule) -> str | None:
    """What in the graph's inputs, outputs or tangents needs the wrapper: a symbolic size
    (sizes saved for the backward), an output that is not a plain tensor, a tangent of
    another layout than the contiguous one :meth:`TrainingCall` makes."""
    from torch._subclasses.fake_tensor import FakeTensor
    if any(not issubclass(o.raw_type, torch.Tensor) for o in meta.output_info):
        return "an output is not a tensor"
    if len(meta.traced_tangents) != sum(o.requires_grad_for_backward for o in meta.output_info):
        return "the traced tangents are not the outputs that need a gradient"
    if any(type(t) not in (torch.Tensor, FakeTensor) or not t.is_contiguous()
           for t in meta.traced_tangents):
        return "a tangent is not a contiguous tensor"
    values = [*(p.meta.get("val") for p in placeholders),
              *(v.meta.get("val") if isinstance(v, torch.fx.Node) else v
                for v in _output_values(graph))]
    if any(not isinstance(v, torch.Tensor) or has_symbolic_layout(v) for v in values):
        return "a symbolic size, or a value that is not a tensor, crosses the graph"
    return None


class TrainingCall:
    """What Dynamo calls for a training graph whose :class:`TrainingSpec` was found: AOT
    Autograd's runtime wrapper (``aot_forward``) until the backward is compiled, then the
    forward graph ``forward`` (boxed) inside an ``autograd.Function`` of its own."""

    def __init__(self, aot_forward: Callable[..., Any], forward: Callable[[list], list],
                 spec: TrainingSpec):
        self.aot_forward = aot_forward
        self.forward = forward
        self.spec = spec
        #: the autograd.Function once the backward is compiled (None before)
        self.function: Any = None

    def __call__(self, *args: Any) -> Any:
        function = self.function
        if function is None:
            return self.aot_forward(*args)
        return function.apply(*self.spec.held, *args)

    def backward_compiled(self, backward: Callable[[list], list],
                          graph: torch.fx.GraphModule, forward: torch.fx.GraphModule) -> None:
        """Take the direct way from the next call, if the backward ``graph`` lines up with
        the ``forward`` graph (:func:`_lines_up`); else say why in the report."""
        if _lines_up(self.spec, forward, graph):
            self.function = _function(self.forward, backward, self.spec)
            return
        report = getattr(self.forward, "report", None)
        if report is not None:  # the calls stay on AOTAutograd's wrapper
            report.call_path = "AOTAutograd runtime wrapper (the backward graph's inputs " \
                               "or outputs are not laid out as expected)"


def _lines_up(spec: TrainingSpec, forward: torch.fx.GraphModule,
              backward: torch.fx.GraphModule) -> bool:
    """Whether ``backward`` takes the tensors ``forward`` saves (its outputs after the user
    outputs), then one tangent per output needing a gradient, and returns a gradient (or
    None) per forward input."""
    saved = len(_output_values(forward)) - spec.outputs
    names = [n.name for n in backward.graph.nodes if n.op == "placeholder"]
    tangents = names[saved:]
    return (len(tangents) == len(spec.tangents)
            and all(name.startswith("tangents") for name in tangents)
            and not any(name.startswith("tangents") for name in names[:saved])
            and len(_output_values(backward)) == spec.inputs)


def _output_values(graph: torch.fx.GraphModule) -> list[Any]:
    """The values a graph returns (one, or each of its tuple)."""
    values = graph.graph.output_node().args[0]
    return list(values) if isinstance(values, (list, tuple)) else [values]


def _function(forward: Callable[[list], list], backward: Callable[[list], list],
              spec: TrainingSpec) -> Any:
    """The ``autograd.Function`` running ``forward`` and ``backward`` (see the module
    doc)."""
    import torch._dynamo
    outputs, non_differentiable, tangents = spec.outputs, spec.non_differentiable, \
        spec.tangents

    @once_differentiable
    def run_backward(ctx: Any, *grads: Any) -> Any:
        if torch._C._functorch.peek_interpreter_stack() is not None:
            raise RuntimeError("simaccel: a compiled backward cannot run inside "
                               "vmap/grad/vjp; wrap the transform inside torch.compile")
        args = [*ctx.saved_tensors]
        args += [_contiguous(grads[i]) for i in tangents]
        return tuple(backward(args))

    class SimaccelTrainingGraph(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> Any:
            values = forward(list(args))
            ctx.save_for_backward(*values[outputs:])
            returned = values[:outputs]
            if non_differentiable:
                ctx.mark_non_differentiable(*(returned[i] for i in non_differentiable))
            return tuple(returned)

        # The engine may run it inside a compiled frame (``loss.backward()`` in a
        # compiled training step), with Dynamo's frame hook installed: the frame the hook
        # meets is torch's disable wrapper, so none of this is traced (nor counted as a
        # graph break), as for AOTAutograd's backward.
        backward = staticmethod(torch._dynamo.disable(
            run_backward, reason="simaccel runs the backward"))

    return SimaccelTrainingGraph


def _contiguous(grad: torch.Tensor) -> torch.Tensor:
    """``grad`` as the backward was traced to take it (an expanded gradient such as
    ``sum()``'s has stride 0)."""
    return grad if grad.is_contiguous() else grad.contiguous()

"""Facts about the values Dynamo hands a backend that live in Dynamo's private state.

Which tensors are module state (parameters, static-address tensors), the concrete value
behind a symbolic size, and leaving fake-tensor mode to work on real tensors
(``unset_fake_temporarily``, re-exported as it is from ``torch._subclasses.fake_tensor``:
a backend compiles while AOTAutograd's fake mode is active), and making the fake value of
a node a graph pass adds (:func:`fake_value`).
"""
from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

__all__ = ["fake_mode_of", "fake_value", "has_static_address", "has_symbolic_layout",
           "is_module_state", "size_hint",
           "unset_fake_temporarily"]


def has_static_address(value: Any) -> bool:
    """True if ``value`` is a tensor marked with ``torch._dynamo.mark_static_address`` (the
    mark is a private attribute of Dynamo's; Dynamo also marks the parameters and buffers
    of the modules it inlines)."""
    return getattr(value, "_dynamo_static_input_type", None) is not None


def is_module_state(value: Any) -> bool:
    """True for a tensor that is state kept across calls rather than per-call data: a
    parameter, or a tensor marked with ``torch._dynamo.mark_static_address`` (KV caches,
    lookup tables, optimizer state; Dynamo marks a module's parameters and buffers so too).

    ``isinstance(t, nn.Parameter)`` is also true for a tensor carrying the ``_is_param``
    flag (fake and subclass parameters: ``nn.parameter._ParameterMeta``).
    """
    return isinstance(value, torch.nn.Parameter) or has_static_address(value)


def has_symbolic_layout(tensor: torch.Tensor) -> bool:
    """Whether a (fake) tensor's sizes, strides or storage offset hold a symbol."""
    return any(isinstance(s, torch.SymInt)
               for s in (*tensor.shape, *tensor.stride(), tensor.storage_offset()))


def size_hint(value: Any) -> Any:
    """The concrete value a symbolic ``value`` (SymInt, SymFloat, SymBool) has in the
    example being traced, read without adding a guard (``int()`` of a SymInt would
    specialize it); ``None`` for a symbol with no such value (unbacked). Any other value
    is returned as it is."""
    node = getattr(value, "node", None)
    if not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) or node is None:
        return value
    return node.hint


def fake_mode_of(values: list[Any]) -> Any:
    """The fake tensor mode the traced ``values`` (a graph's ``meta["val"]`` tensors)
    belong to, to compute the value of a node a pass adds (None if they are real)."""
    from torch._guards import detect_fake_mode
    return detect_fake_mode(values)


def fake_value(fake_mode: Any, shape: Any, stride: Any, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    """A new fake tensor of ``fake_mode`` with this metadata (static sizes), made directly
    (~11 us): ``torch.empty_strided`` under the mode dispatches through it (~250 us). The
    meta tensor inside is made outside any active fake mode (AOTAutograd's, while a
    backend compiles), or the mode would fake it too."""
    with unset_fake_temporarily():
        meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        return FakeTensor(fake_mode, meta, device)

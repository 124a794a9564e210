"""A compiled graph's steady call by data addresses.

A static-shape graph is called the general way until its binding records a replay;
from then on, once the runtime offers an :class:`~simaccel.runtime.address.AddressReplay`
(no resident input, no input written back but by its kernel in place), a call reads
each tensor argument's data address (~0.1 us, against a numpy view at ~1 us and the
general path's per-position checks), makes the outputs as the general call does and
passes their addresses: an optimizer step's parameters, state and gradients, a training
graph's activations, saved tensors and gradients.

A tensor is checked against the layout the first call had: a copied one every call, a
host-mapped one when its address moved (Dynamo's tensor guards pin a forward graph's,
the forward's own outputs a backward's; a mismatch means the general path must look at
it, and it raises its error there). Anything the fast call does not fit (a scalar passed
as a tensor, a state the replay no longer holds) goes the general way, nothing moved.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from simaccel.runtime.address import AddressReplay

#: a tensor's data address, as a C-level function for ``map``
_DATA_PTR = torch.Tensor.data_ptr
_NUMBERS = (float, int, bool)


class AddressCall:
    """``replay`` called with a graph's argument list (see the module doc). Made from the
    general call it was found after (:meth:`fits` first): its arguments ``args`` (each
    tensor's dtype, sizes and strides are taken from them), the output ``makers`` and
    ``scalars`` of its layout, the graph's ``host_outputs`` (values the program does not
    compute), the constant ``bank``'s argument indices and ``bumped``, the inputs whose
    version the graph increments after a call."""

    __slots__ = ("replay", "_layouts", "_bank", "_bumped", "_makers", "_scalars",
                 "_host_outputs")

    def __init__(self, replay: AddressReplay, args: list[Any],
                 makers: list[Callable[[], torch.Tensor] | None], scalars: dict[int, Any],
                 host_outputs: dict[int, Any], bank: frozenset[int],
                 bumped: tuple[int, ...]):
        self.replay = replay
        self._layouts = [(t.dtype, t.shape, t.stride()) for t in
                         (args[i] for i in replay.indices)]
        self._makers, self._scalars, self._host_outputs = makers, scalars, host_outputs
        self._bank = tuple(sorted(bank))
        self._bumped = bumped

    @staticmethod
    def fits(replay: AddressReplay, args: list[Any], outputs: list[Any]) -> bool:
        """Whether calls like this general one (``args``, ``outputs``) can go by address:
        every input the replay takes a CPU tensor, the copied ones C-contiguous and of
        their copy's bytes, every output it writes a C-contiguous tensor from its first
        element, the copied ones of their copy's bytes (later calls are checked to have
        the same layouts)."""
        inputs = [args[i] for i in replay.indices]
        written = [outputs[p] for p in replay.outputs]
        copied_in, copied_out = replay.copy_bytes()
        return all(isinstance(t, torch.Tensor) and t.is_cpu for t in inputs) \
            and all(t.is_contiguous() and t.nbytes == nbytes
                    for t, nbytes in zip(inputs[replay.mapped:], copied_in)) \
            and all(isinstance(o, torch.Tensor) and o.is_contiguous()
                    and not o.storage_offset() for o in written) \
            and all(outputs[p].nbytes == nbytes for p, nbytes in copied_out.items())

    def __call__(self, args: list[Any]) -> list[Any] | None:
        """The call's outputs, or None, nothing moved, if it does not fit."""
        replay = self.replay
        tensors = list(map(args.__getitem__, replay.indices))
        try:
            addresses = list(map(_DATA_PTR, tensors))
        except TypeError:  # not a tensor
            return None
        if not self._laid_out(tensors, addresses):
            return None
        for i in self._bank:
            if type(args[i]) not in _NUMBERS:
                return None  # a 0-d tensor: the general path reads its value
        outputs = [None if make is None else make() for make in self._makers]
        output_addresses = [0] * len(outputs)
        for position in replay.outputs:
            output_addresses[position] = outputs[position].data_ptr()  # type: ignore
        if not replay(args, addresses, tensors, outputs, output_addresses):
            return None
        for i in self._bumped:
            bump_version(args[i])
        scalars = self._scalars
        for index, value in self._host_outputs.items():
            outputs[index] = value(args) if callable(value) else scalars.get(index, value)
        return outputs

    def _laid_out(self, tensors: list[torch.Tensor], addresses: list[int]) -> bool:
        """Whether every copied tensor, and every mapped one at a new address, has its
        first call's dtype, sizes and strides, on the CPU."""
        replay, layouts = self.replay, self._layouts
        mapped = replay.mapped
        for k, (t, address) in enumerate(zip(tensors, addresses)):
            if k < mapped and address == replay.addresses[k]:
                continue
            dtype, shape, stride = layouts[k]
            if t.dtype is not dtype or t.shape != shape or t.stride() != stride \
                    or not t.is_cpu:
                return False
        return True


def bump_version(t: Any) -> None:
    """Increment ``t``'s version counter, as an in-place op does in eager."""
    if isinstance(t, torch.Tensor) and not t.is_inference():
        torch.autograd.graph.increment_version(t)

"""A compiled graph's steady call by data addresses.

A static-shape graph is called the general way until its binding records a replay;
from then on, once the runtime offers an :class:`~simaccel.runtime.address.AddressReplay`
(no input written back but by its kernel in place), and while the resident inputs are
the tensors and versions the last general call uploaded (a model's weights in inference
or between optimizer steps), a call reads each tensor argument's data address (~0.1 us,
against a numpy view at ~1 us and the general path's per-position checks), makes the
outputs as the general call does and passes their addresses: an optimizer step's
parameters, state and gradients, a training graph's activations, saved tensors and
gradients, an inference graph's inputs and outputs.

A tensor is checked against the layout the first call had: a copied one every call, a
host-mapped one when its address moved (Dynamo's tensor guards pin a forward graph's,
the forward's own outputs a backward's; a mismatch means the general path must look at
it, and it raises its error there). Anything the fast call does not fit (a scalar passed
as a tensor, a state the replay no longer holds) goes the general way, nothing moved.
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from simaccel.codegen.dtypes import BANK_TORCH_DTYPES
from simaccel.host_args import numpy_view
from simaccel.runtime.address import AddressReplay

#: a tensor's data address and version counter, as C-level functions for ``map``
_DATA_PTR = torch.Tensor.data_ptr
_VERSION = operator.attrgetter("_version")
_NUMBERS = (float, int, bool)


class AddressCall:
    """``replay`` called with a graph's argument list (see the module doc). Made from the
    general call it was found after (:meth:`fits` first): its arguments ``args`` (each
    tensor's dtype, sizes and strides are taken from them), the output ``makers`` and
    ``scalars`` of its layout, the graph's ``host_outputs`` (values the program does not
    compute), the constant ``bank``'s argument indices and ``bumped``, the inputs whose
    version the graph increments after a call."""

    __slots__ = ("replay", "_layouts", "_bank", "_bumped", "_makers", "_scalars",
                 "_host_outputs", "_resident", "_resident_tensors", "_resident_state",
                 "served")

    def __init__(self, replay: AddressReplay, args: list[Any],
                 makers: list[Callable[[], torch.Tensor] | None], scalars: dict[int, Any],
                 host_outputs: dict[int, Any], bank: frozenset[int],
                 bumped: tuple[int, ...], resident: Sequence[int] = ()):
        self.replay = replay
        #: the resident inputs' indices, and their tensors, data addresses and versions
        #: at the general call that uploaded them (a call with any other goes the
        #: general way, which uploads it)
        self._resident = tuple(resident)
        self._resident_tensors = [args[i] for i in self._resident]
        self._resident_state = _state_of(self._resident_tensors)
        self._layouts = [(t.dtype, t.shape, t.stride()) for t in
                         (args[i] for i in replay.indices)]
        self._makers, self._scalars, self._host_outputs = makers, scalars, host_outputs
        self._bank = tuple(sorted(bank))
        self._bumped = bumped
        #: the calls it ran
        self.served = 0

    @staticmethod
    def fits(replay: AddressReplay, args: list[Any], outputs: list[Any]) -> bool:
        """Whether calls like this general one (``args``, ``outputs``) can go by address:
        every input the replay takes a CPU tensor, the copied ones C-contiguous and of
        their copy's bytes, every output it writes a tensor whose layout the replay
        takes (:meth:`AddressReplay.take_outputs`, decided here). Later calls are
        checked to have the same input layouts; their outputs come from the same
        makers."""
        inputs = [args[i] for i in replay.indices]
        written = {p: outputs[p] for p in replay.outputs}
        return all(isinstance(t, torch.Tensor) and t.is_cpu for t in inputs) \
            and all(t.is_contiguous() and t.nbytes == nbytes
                    for t, nbytes in zip(inputs[replay.mapped:], replay.input_bytes())) \
            and all(isinstance(o, torch.Tensor) for o in written.values()) \
            and replay.take_outputs({p: (tuple(o.shape), o.stride(),
                                         numpy_view(o).itemsize)
                                     for p, o in written.items()})

    def __call__(self, args: list[Any]) -> list[Any] | None:
        """The call's outputs, or None, nothing moved, if it does not fit."""
        replay = self.replay
        if self._resident and not self._resident_unchanged(args):
            return None
        tensors = list(map(args.__getitem__, replay.indices))
        try:
            addresses = list(map(_DATA_PTR, tensors))
        except TypeError:  # not a tensor
            return None
        if not self._laid_out(tensors, addresses):
            return None
        numbers = self._numbers(args)
        if numbers is None:
            return None
        outputs = [None if make is None else make() for make in self._makers]
        output_addresses = [0] * len(outputs)
        for position in replay.outputs:
            output_addresses[position] = outputs[position].data_ptr()  # type: ignore
        views = [numpy_view(outputs[p]) for p in replay.strided]  # type: ignore[arg-type]
        if not replay(numbers, addresses, output_addresses, views):
            return None
        for i in self._bumped:
            bump_version(args[i])
        self.served += 1
        scalars = self._scalars
        for index, value in self._host_outputs.items():
            outputs[index] = value(args) if callable(value) else scalars.get(index, value)
        return outputs

    def _numbers(self, args: list[Any]) -> list[Any] | None:
        """``args`` with a Python number at each of the constant bank's positions (a
        copy where a 0-d tensor is there: its value, as the general path reads it), or
        None where another value is."""
        numbers = args
        for i in self._bank:
            value = args[i]
            if type(value) in _NUMBERS:
                continue
            if type(value) is not torch.Tensor or value.dim() \
                    or value.dtype not in BANK_TORCH_DTYPES:
                return None
            if numbers is args:
                numbers = list(args)
            numbers[i] = value.item()
        return numbers

    def _resident_unchanged(self, args: list[Any]) -> bool:
        """Whether the resident inputs are the very tensors of the general call, at the
        same addresses and versions (a model's weights, call after call)."""
        tensors = list(map(args.__getitem__, self._resident))
        return all(map(operator.is_, tensors, self._resident_tensors)) \
            and _state_of(tensors) == self._resident_state

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


def _state_of(tensors: list[Any]) -> tuple[list[int], list[int]]:
    """The data addresses and version counters of ``tensors``."""
    return list(map(_DATA_PTR, tensors)), list(map(_VERSION, tensors))


def bump_version(t: Any) -> None:
    """Increment ``t``'s version counter, as an in-place op does in eager."""
    if isinstance(t, torch.Tensor) and not t.is_inference():
        torch.autograd.graph.increment_version(t)

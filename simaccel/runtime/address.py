"""Address replays: a program's steady call entered with its tensors' data addresses.

A replay (:mod:`simaccel.runtime.replay`) repeats a recorded call: copy the inputs in,
point the launches on host memory at this call's tensors, pack the lifted scalars, run
the launches, copy the outputs out. The general call (:meth:`Program.run
<simaccel.runtime.program.Program.run>`) gets there from a numpy view of every argument
and output and per-position checks of each; an :class:`AddressReplay` takes the data
addresses (bytes) its caller read from the tensors (~0.1 us each, against ~1 us a view)
and does the same work by address:

- host-mapped inputs (an optimizer's parameters, state and gradients; a training graph's
  large activations): the addresses are compared with the ones the launches point at as
  one list, and the launches whose tensor moved are patched, as a CUDA graph's kernel
  nodes take new parameters;
- copied inputs: one ``memmove`` each into the device view, at an aligned address (else
  the general path stages it);
- host-mapped outputs: the launch writing one is patched to the new output's address;
- copied outputs: one ``memmove`` each from the device view into the caller's new
  output where it has the view's layout, else a numpy copy into a view of it;
- resident inputs: the caller vouches they are what the device holds.

Measured in one process, the address call and the general replay alternating by round
(``/tmp/s43/abaddr.py`` and ``abgpt.py`` in the session notes): the SGD-momentum MLP
training step of ``simaccel bench`` 1.174x and 1.208x eager's step against 1.210x and
1.244x (40-60 rounds), the optimizer step's phase alone 324 us against 364; the GPT-2
forward 0.952x and 0.865x eager's against 1.005x and 0.928x (30 rounds).

The call moves the same bytes, runs the same kernels and lands on the timeline, trace
and counters exactly as the general replay (``tests/backend/test_address_calls.py``); a
call it does not fit (another state, a copied input at a misaligned address, a launch it
cannot patch by address) returns False before anything moves, and the caller goes the
general way.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from simaccel.runtime.direct import SteadyEntry

#: ``memmove(destination, source, bytes)`` on data addresses
_MEMMOVE = ctypes.memmove


class AddressReplay(SteadyEntry):
    """One binding's replay for a caller passing data addresses (see the module doc);
    made by :func:`address_replay`.

    :attr:`indices`: the argument index of each input the call passes an address for,
    the :attr:`mapped` host-mapped ones first (in the order :attr:`addresses`, where the
    launches point now, has them), then the copied ones. :attr:`outputs`: the positions
    of the outputs the program writes (the caller makes each as a new tensor and
    passes its address)."""

    __slots__ = ("indices", "mapped", "addresses", "outputs", "strided", "_positions",
                 "_targets", "_movable", "_copies_in", "_copies_out", "_strided_out",
                 "_written", "_written_at", "_alignment")

    def __init__(self, program: Any, bound: Any):
        super().__init__(program, bound)
        replay = self.replay
        self._alignment = replay.alignment
        mapped = program._mapped_steps
        self.mapped = len(mapped.indices)
        self.indices: tuple[int, ...] = (*mapped.indices,
                                         *(index for index, _, _, _ in replay.inputs))
        #: the streamed position of each mapped input
        self._positions = mapped.positions
        #: per mapped input: (``patch`` of each launch reading or updating it, its
        #: argument positions there); a binding's launches on host memory are made once
        #: and only ever patched after, so the methods are taken once
        self._targets: list[list[tuple[Any, tuple[int, ...]]]] = [[] for _ in self._positions]
        #: per mapped input: whether every such launch is patched by address (else a
        #: call where it moved goes the general way, which binds such a launch anew: a
        #: model's weights never move)
        self._movable = [True] * len(self._positions)
        where = {p: k for k, p in enumerate(self._positions)}
        for step in mapped.steps:
            launch = bound.launches[step.index]
            for p in step.inputs:
                buffer = program._streamed[p].buffer
                self._targets[where[p]].append((getattr(launch, "patch", None),
                                                step.arguments[buffer]))
                self._movable[where[p]] &= _by_address(launch)
        self.addresses: list[int] = [bound.mapped_addresses.get(p, 0) for p in self._positions]
        #: (device address, bytes) of each copied input's destination, in order
        self._copies_in = [(data_address(dst), dst.nbytes) for _, dst, _, _ in replay.inputs]
        #: (output position, device address, bytes) of each copied output moved by one
        #: ``memmove``, and (output position, device view) of each copied by numpy into
        #: the caller's view (:meth:`take_outputs` decides)
        self._copies_out: list[tuple[int, int, int]] = []
        self._strided_out: list[tuple[int, np.ndarray]] = []
        #: the positions of the outputs copied by numpy
        self.strided: list[int] = []
        #: (output position, ``patch`` of the launch writing it, argument positions) of
        #: each mapped output
        self._written = [(pos, bound.launches[step.index].patch, step.arguments[buffer])
                         for step in mapped.writing for pos, buffer in step.outputs]
        #: output position -> the address its launch was pointed at by this replay
        self._written_at: dict[int, int] = {}
        self.outputs = sorted({p for p, _, _, _, _ in replay.outputs}
                              | {p for p, _, _ in self._written})

    def input_bytes(self) -> list[int]:
        """The bytes of each copied input (in :attr:`indices`' order, after the mapped
        ones): a caller's tensor there must hold them, C-contiguous, for one
        ``memmove``."""
        return [nbytes for _, nbytes in self._copies_in]

    def take_outputs(self, layouts: dict[int, tuple[tuple[int, ...], tuple[int, ...], int]]
                     ) -> bool:
        """Decide how each copied output reaches the caller's, given its layout by
        position (sizes, strides in elements, bytes per element, as every call's output
        will have): one ``memmove`` where the device view covers one block in the same
        order of dimensions, else a numpy copy into a view of it (a head's slice of a
        fused projection; attention statistics laid out heads-inner); False if an output
        fits neither (sizes or element size differ). Call once, before the first call."""
        for position, src, _, _, _ in self.replay.outputs:
            shape, strides, itemsize = layouts[position]
            if tuple(shape) != src.shape or itemsize != src.itemsize:
                return False
            if _dense(src) and all(a * itemsize == b for a, b, n in
                                   zip(strides, src.strides, shape) if n > 1):
                self._copies_out.append((position, data_address(src), src.nbytes))
            else:
                self._strided_out.append((position, src))
        self.strided = [position for position, _ in self._strided_out]
        return True

    def __call__(self, args: list[Any], addresses: list[int],
                 output_addresses: Sequence[int], views: Sequence[np.ndarray] = ()) -> bool:
        """Replay the call on ``args`` (Python numbers at the constant bank's positions),
        its inputs at ``addresses`` (bytes; :attr:`indices`' order), into the caller's
        new outputs at ``output_addresses`` (by output position; ``views``: host arrays
        of the :attr:`strided` ones, in order); False (nothing moved) when the state
        this replay was made in changed or a copied input is misaligned.

        The launches it points at this call's tensors hold none of them after it: every
        call points them at its own tensors before they run (here, or the general call's
        binding, which compares with the addresses recorded here), so a tensor they read
        or wrote can be freed once the call returns (a gradient set to None; its memory
        comes back for the next one), as the caller's own memory is its to free. Measured
        on the MLP training step (in-process, alternating rounds): 1.182x and 1.186x
        eager's step against 1.193x and 1.216x holding the last call's tensors, whose
        gradients then took two sets of addresses in turn."""
        program, bound = self.program, self.bound
        mapped = self.mapped
        alignment = self._alignment
        for address in addresses[mapped:]:
            if address % alignment:
                return False  # staged by the general path
        with program._lock:
            if not self.holds(bound.layout.key):
                return False
            moved = addresses[:mapped]
            if moved != self.addresses and not self._point(moved):
                return False
            if self._written:
                self._point_outputs(output_addresses)

            def upload(_: list[Any]) -> None:
                for (dst, nbytes), src in zip(self._copies_in, addresses[mapped:]):
                    _MEMMOVE(dst, src, nbytes)

            def download(_: list[Any]) -> None:
                for position, src, nbytes in self._copies_out:
                    _MEMMOVE(output_addresses[position], src, nbytes)
                for (_, view), host in zip(self._strided_out, views):
                    host[...] = view
            self.count(self.replay.run_bound(args, [], bound.layout.sizes, 0.0, download,
                                             upload))
        return True

    def _point(self, addresses: list[int]) -> bool:
        """Patch every launch on a mapped input that moved (False, nothing patched, if one
        cannot be patched by address alone); the binding's record of what its launches
        point at follows, so a general call after this one binds from there."""
        moved = [k for k, (new, old) in enumerate(zip(addresses, self.addresses))
                 if new != old]
        movable = self._movable
        if not all(movable[k] for k in moved):
            return False
        bound, targets, positions = self.bound, self._targets, self._positions
        for k in moved:
            new = addresses[k]
            for patch, arguments in targets[k]:
                for argument in arguments:
                    patch(argument, None, new)
            bound.mapped_addresses[positions[k]] = new
        bound.mapped_checked.clear()  # the arrays the general call checked are not bound
        bound.mapped_sources = None
        self.addresses = addresses
        return True

    def _point_outputs(self, addresses: Sequence[int]) -> None:
        """Patch the launch writing each mapped output that is not at its last address."""
        at = self._written_at
        for pos, patch, arguments in self._written:
            address = addresses[pos]
            if at.get(pos) != address:
                for argument in arguments:
                    patch(argument, None, address)
                at[pos] = address


def _by_address(launch: Any) -> bool:
    """Whether ``launch``'s ``patch`` stores an address alone (the array passed, None
    here, is only kept alive)."""
    return getattr(launch, "patched_by_address", False)


def data_address(view: np.ndarray) -> int:
    """The data address (bytes) of a device view."""
    return view.__array_interface__["data"][0]


def address_replay(program: Any, layout: Any) -> AddressReplay | None:
    """The :class:`AddressReplay` of ``program``'s binding at ``layout``, or None if the
    binding has no record yet or its calls need more than addresses: an input written
    back, a host step, an input copy that is not of its whole buffer in C order, a
    launch writing a mapped output that cannot be patched by address. Resident inputs
    are the caller's to vouch for: it calls with the very tensors, at the same versions,
    whose contents the last call left in their device copies (else it calls the general
    way, which uploads what changed)."""
    bound = program._bound.get(layout.key)
    workspace = program._state.workspace
    if bound is None or not bound.replay or workspace is None \
            or bound.offset != workspace.offset or program._host_steps:
        return None
    replay = bound.replay
    if any(index is not None for *_, index in replay.outputs) \
            or not all(dst.flags.c_contiguous for _, dst, _, _ in replay.inputs):
        return None
    if not all(_by_address(bound.launches[step.index])
               for step in program._mapped_steps.writing):
        return None
    return AddressReplay(program, bound)


def _dense(view: np.ndarray) -> bool:
    """Whether a device view covers one block of memory from its first element, in some
    order of its dimensions (a copy by address is one ``memmove``, into a tensor of the
    same strides)."""
    extent = view.itemsize
    for stride, size in sorted(zip(view.strides, view.shape)):
        if size > 1 and stride != extent:
            return False
        extent *= size
    return True

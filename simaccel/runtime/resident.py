"""What a program keeps on the device between calls, and the per-workspace bindings.

:class:`ResidentState` holds a program's device blocks (constants and constant bank in
one block, a block per resident input, the workspace) so they can be freed together,
at garbage collection or when a reconfigure replaced device memory.
:class:`BoundWorkspace` holds everything a call needs that depends only on where the
workspace block is: buffer views, output and input copy lists, bound kernel launches.
"""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from simaccel.runtime.memory import Block
from simaccel.runtime.spec import SIZE_BANK


@dataclass
class ResidentState:
    """A program's device memory that outlives a call."""

    allocator: Any = None
    #: constants and the constant bank, uploaded once per device generation
    block: Block | None = None
    #: the per-call buffers (planned offsets), kept between calls
    workspace: Block | None = None
    #: one block per resident input, by buffer name
    input_blocks: dict[str, Block] = field(default_factory=dict)
    #: device views of constants and resident inputs, by buffer name
    views: dict[str, np.ndarray] = field(default_factory=dict)
    #: the constant bank's device bytes
    bank: np.ndarray | None = None
    #: the size bank (part of ``bank``): every size symbol's value (int64, in
    #: ``spec.symbols`` order)
    size_bank: np.ndarray | None = None
    #: buffer -> content key of the resident input uploaded into it
    keys: dict[str, Any] = field(default_factory=dict)
    #: the content keys (argument index -> key) of the last call that found or put
    #: every resident input on the device: a call with equal keys uploads nothing,
    #: decided by one dict comparison (a GPT-2 call takes 82 parameters); None after
    #: anything else changed ``keys``
    held: dict[int, Any] | None = None
    #: (the views they were made from, views, addresses) of :meth:`fixed_views`
    _fixed: tuple[tuple, dict[str, np.ndarray], dict[str, int]] | None = None
    #: owner (a launch step's name) -> (content key of the input it was made from, the
    #: form a kernel derived from a resident input, the device block it occupies): one
    #: per step, shared by the step's launches at every size tuple (:class:`ResidentOperand`)
    derived: dict[str, tuple[Any, Any, Block]] = field(default_factory=dict)

    def changed(self, plans: Any, keys: dict[int, Any]) -> list[Any]:
        """The resident input ``plans`` whose content key in ``keys`` (argument index ->
        key; a missing key always differs) is not the one uploaded into their buffer,
        recorded as uploaded now (the caller uploads them)."""
        if keys and keys == self.held:
            return []
        known = self.keys
        changed = []
        complete = True
        for plan in plans:
            key = keys.get(plan.index)
            complete = complete and key is not None
            if key is None or known.get(plan.buffer) != key:
                changed.append(plan)
                known[plan.buffer] = key
        self.held = keys if complete else None
        return changed

    def fixed_views(self, bank: Any) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        """The views of every buffer outside the workspace (constants, resident inputs,
        ``bank``'s slots in the constant bank, the size bank) and their data addresses
        (bytes), made again only when one of them is a new view (a reconfigure, a
        resident input's new block): a decode step whose KV cache grows binds its
        launches anew every call."""
        key = (self.bank, *self.views.values())
        fixed = self._fixed
        if fixed is not None and len(fixed[0]) == len(key) \
                and all(map(operator.is_, key, fixed[0])):
            return fixed[1], fixed[2]
        views = dict(self.views)
        views.update(bank.views(self.bank))
        views[SIZE_BANK] = self.size_bank
        addresses = {name: view.ctypes.data for name, view in views.items()}
        self._fixed = (key, views, addresses)
        return views, addresses

    def set_key(self, buffer: str, key: Any) -> None:
        """``buffer`` holds the contents ``key`` names (None: unknown, uploaded again)."""
        self.keys[buffer] = key
        self.held = None

    def free(self) -> int:
        """Give every block back to the allocator it came from and forget the views;
        returns the bytes the blocks held."""
        allocator = self.allocator
        blocks = [b for b in (self.block, self.workspace, *self.input_blocks.values(),
                              *(held[2] for held in self.derived.values())) if b is not None]
        for block in blocks:
            if allocator is not None:
                try:
                    allocator.free(block)
                except Exception:  # the allocator was replaced by a reconfigure: nothing to free
                    pass
        self.allocator = self.block = self.workspace = self.bank = self.size_bank = None
        self.input_blocks.clear()
        self.derived.clear()
        self.views.clear()
        self.keys.clear()
        self.held = self._fixed = None
        return sum(b.size for b in blocks)

    def operand(self, buffer: str, owner: str, count: Callable[[str, int], None]
                ) -> ResidentOperand:
        """The :class:`ResidentOperand` of resident input ``buffer`` for the launch step
        ``owner``; ``count(key, n)`` counts the forms kept in the device's stats."""
        return ResidentOperand(functools.partial(self.keys.get, buffer),
                               functools.partial(self._form, owner),
                               functools.partial(self._keep, owner, count))

    def _form(self, owner: str, key: Any) -> Any:
        held = self.derived.get(owner)
        if held is None:
            return None
        if held[0] == key:
            return held[1]
        self._release(owner)  # made from other contents: stale
        return None

    def _keep(self, owner: str, count: Callable[[str, int], None], key: Any, form: Any,
              nbytes: int) -> bool:
        self._release(owner)
        block = self.allocator.try_malloc(nbytes) if self.allocator is not None else None
        if block is None:
            return False
        self.derived[owner] = (key, form, block)
        count("derived_operands", 1)
        count("derived_operand_bytes", nbytes)
        return True

    def release_derived(self) -> int:
        """Drop every derived form and give its memory back (under memory pressure: they
        are made again); returns the bytes freed."""
        freed = sum(held[2].size for held in self.derived.values())
        for owner in list(self.derived):
            self._release(owner)
        return freed

    def _release(self, owner: str) -> None:
        held = self.derived.pop(owner, None)
        if held is not None and self.allocator is not None:
            self.allocator.free(held[2])


def step_operands(state: ResidentState, step: Any, stable: set[str],
                  count: Callable[[str, int], None]) -> list[ResidentOperand | None] | None:
    """Per buffer of launch ``step``, its :class:`ResidentOperand` where it is one of the
    ``stable`` resident inputs (no step writes them), for a kernel that keeps derived
    forms of such inputs (``step.fn.keeps_derived``); None for any other kernel."""
    if not getattr(step.fn, "keeps_derived", False):
        return None
    return [state.operand(b, step.name, count) if b in stable else None for b in step.buffers]


@dataclass(frozen=True)
class ResidentOperand:
    """A kernel argument holding a resident input no step of its program writes, as a
    library kernel that keeps a derived form of it sees it (oneDNN's blocked copy of a
    linear layer's weight: :class:`simaccel.codegen.library.Gemm`).

    ``content()``: the content key of the buffer's device copy now (it changes with every
    upload of new contents; None: unknown). ``form(key)``: the form kept for the step
    (by this launch or the step's launch at another size tuple) if it was made from the
    contents ``key`` names, else None (a stale one is dropped, its memory given back).
    ``keep(key, form, nbytes)``: keep ``form``, made from contents ``key``, in
    ``nbytes`` of device memory, as a real device would hold it; False when the device
    has no room (the kernel then reads the plain operand). A form is kept until it goes
    stale, the workspace is released or the program's device memory is freed."""

    content: Callable[[], Any]
    form: Callable[[Any], Any]
    keep: Callable[[Any, Any, int], bool]


@dataclass
class BoundWorkspace:
    """A workspace block's views and launches, built once per block (the views never
    change while it is kept)."""

    offset: int  #: the workspace block's offset in device memory (bytes)
    views: dict[str, np.ndarray]  #: every buffer's device view, by name
    #: (output position, strided device view, buffer) of every tensor output
    output_copies: list[tuple[int, np.ndarray, str]]
    #: device destination of each streamed input (None for a mapped one)
    input_dsts: list[np.ndarray | None]
    #: per step: a zero-argument launch, or None for a host step
    launches: list[Callable[[], Any] | None]
    #: per step: simulated compute time (ns) at these sizes
    durations: list[float]
    #: the size tuple's layout the views and launches are made for
    layout: Any
    #: ``input_dsts`` in the shapes of the host arrays copied into them (first call)
    shaped_dsts: list[np.ndarray | None] | None = None
    #: streamed position -> the data address (bytes) of the mapped input the launches
    #: reading it are bound to
    mapped_addresses: dict[int, int] = field(default_factory=dict)
    #: streamed position -> the host array last checked there (the same array object
    #: again needs no check: a numpy array keeps its layout)
    mapped_checked: dict[int, np.ndarray] = field(default_factory=dict)
    #: every streamed input's host array at the last call that bound the mapped launches
    #: (the same array objects again, and no mapped output, bind nothing)
    mapped_sources: list[Any] | None = None
    #: buffer -> data address (bytes) of each workspace view, known from its offset
    #: (reading one back from numpy costs ~2 us, and a launch on host memory is bound
    #: anew every call)
    addresses: dict[str, int] = field(default_factory=dict)
    #: buffer -> dtype of each host-mapped input and output (checked on a new array)
    mapped_dtypes: dict[str, np.dtype] = field(default_factory=dict)
    #: buffer -> the array a host-mapped output's kernel writes when a call left that
    #: output out (no host array to write)
    mapped_scratch: dict[str, np.ndarray] = field(default_factory=dict)
    #: the DMA plan of each per-call batch (sizes fixed by ``layout``), by what varies
    #: between its calls: the h2d batch by its staging flags, the constant bank's as
    #: ``"const"``, the d2h batch by ``("d2h", labels, staging flags or None)``
    batch_plans: dict[Any, Any] = field(default_factory=dict)
    #: the DMA call plans of this binding's calls, by the ids of their batch plans and
    #: the kernels they ran (see :func:`simaccel.runtime.calls.call_plan`)
    call_plans: dict[tuple, Any] = field(default_factory=dict)
    #: the binding's recorded call (:mod:`simaccel.runtime.replay`): None until it is
    #: recorded, False when no call of the binding can be replayed
    replay: Any = None
    #: general calls made on this binding so far (a program with size symbols records
    #: its replay at a binding's second call: see ``Program.run``)
    general_calls: int = 0
    #: how a replay runs ``launches`` (:class:`~simaccel.runtime.sequence.
    #: LaunchSequence`, recording command lists): None until a replay runs them, and
    #: again after a launch was bound anew
    sequence: Any = None

    def __post_init__(self) -> None:
        #: ``output_copies`` as columns: output positions, device views, labels (the
        #: download of a call whose outputs are all present moves exactly these)
        self.output_positions = [k for k, _, _ in self.output_copies]
        self.output_srcs = [src for _, src, _ in self.output_copies]
        self.output_labels = [label for _, _, label in self.output_copies]

    def dsts_shaped_like(self, srcs: list[np.ndarray]) -> list[np.ndarray | None]:
        """``input_dsts`` viewed in the shapes of this call's host arrays (made at the first
        call and kept): a copy between equal shapes is numpy's cheapest (a flat destination
        is reshaped at every copy otherwise, ~0.3 us). A later call's arrays have the same
        shapes (the layout fixes the sizes); one that does not is still copied right, in C
        order, by :func:`~simaccel.dma.copy.copy_array`."""
        if self.shaped_dsts is None:
            self.shaped_dsts = [d.reshape(h.shape) if d is not None and d.flags.c_contiguous
                                else d for d, h in zip(self.input_dsts, srcs)]
        return self.shaped_dsts

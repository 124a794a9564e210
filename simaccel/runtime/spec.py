"""The frozen hand-off from compile time to call time: a :class:`ProgramSpec`.

Compile time decides everything about a graph once and writes it down here:

* :class:`BufferDecl`: every device buffer (dtype, elements, kind).
* :class:`LaunchStep` / :class:`HostStep`: the ordered steps, each declaring exactly the
  buffers it ``reads`` and ``writes`` (liveness, planning and host mapping use only those).
* :class:`InputPlan`: one record per graph input: how it reaches the device
  (:class:`Placement`), whether its DMA is direct or staged, its host layout, its
  constant-bank slot dtype.
* :class:`OutputDecl`: where each graph output is read back from.

:class:`~simaccel.runtime.program.Program` is built from a spec and plans memory once.
This module knows nothing of torch.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np

from simaccel.errors import SimAccelError
from simaccel.runtime.sizes import Size, SymbolSource


@dataclass(frozen=True)
class BufferDecl:
    """A device buffer: dtype (numpy name), element count (an int, or an expression over
    the program's size symbols), kind (input, scalar, constant, temp)."""

    name: str
    dtype: str
    numel: Size
    kind: str

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of a static buffer (a dynamic one's depend on the call's sizes)."""
        if not isinstance(self.numel, int):
            raise SimAccelError(f"buffer {self.name} has a dynamic size ({self.numel})")
        return self.numel * self.itemsize


#: the buffer name a kernel reading dynamic sizes takes the program's size bank by
SIZE_BANK = "__size_bank__"


@dataclass(frozen=True)
class LaunchStep:
    """Launch ``fn(*buffers, *params)`` on device buffers (``buffers`` in argument order);
    ``reads``/``writes``: exactly the buffers it loads from and stores to;
    ``flops``/``nbytes`` feed the roofline timing model. ``params``, ``flops`` and
    ``nbytes`` may be size expressions (strings), evaluated per call.

    ``size_slots``: the size symbols the kernel reads from the program's size bank (a
    device buffer holding every symbol's value, :data:`SIZE_BANK` in ``buffers``): it is
    launched as ``fn(*buffers, *params, *slots)``, each slot the symbol's position in the
    bank."""

    name: str
    fn: Callable[..., Any]
    buffers: tuple[str, ...]
    params: tuple[Size, ...]
    flops: Size | float
    nbytes: Size | float
    reads: frozenset[str]
    writes: frozenset[str]
    size_slots: tuple[str, ...] = ()
    on_device: ClassVar[bool] = True


@dataclass(frozen=True)
class HostStep:
    """Run ``fn(views, sizes)`` on the host (a fallback op; ``sizes``: the call's size
    symbols by name); ``reads`` are copied device to host first and ``writes`` host to
    device after, by DMA (in this order). ``sizes``: the size values (ints or
    expressions) its arguments and results name, so the program binds their symbols."""

    name: str
    fn: Callable[[dict[str, np.ndarray], dict[str, int]], None]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    sizes: tuple[Size, ...] = ()
    on_device: ClassVar[bool] = False


Step = LaunchStep | HostStep


@dataclass(frozen=True)
class OutputDecl:
    """Graph output: a strided view (elements) of a device buffer (sizes may be
    expressions over the program's size symbols)."""

    buffer: str
    shape: tuple[Size, ...]
    strides: tuple[Size, ...]
    offset: Size
    dtype: str
    #: host-mapped: the one kernel writing the buffer writes the caller's host array in
    #: place (:func:`~simaccel.runtime.hostmap.place_mapped_outputs`), nothing is copied
    #: back and the buffer takes no device memory
    mapped: bool = False


class Placement(enum.Enum):
    """How a graph input reaches the device on a call."""

    COPIED = "copied"      #: DMA'd into the workspace on every call
    MAPPED = "mapped"      #: read in place from host memory by its one kernel
    #: read and written in place in host memory by its one kernel: a static-address input
    #: the graph updates in place (an optimizer's parameters and state)
    MAPPED_UPDATE = "mapped update"
    RESIDENT = "resident"  #: kept in device memory, uploaded again only when it changes
    BANK = "bank"          #: a scalar packed into the resident constant bank


@dataclass(frozen=True)
class InputPlan:
    """Everything the runtime needs to know about graph input ``index`` (its position in
    the call's argument list), decided once at compile time from the facts the frame's
    guards pin.

    ``aligned``: True if its host address is a multiple of the device alignment (one
    direct DMA descriptor), False if it must be staged, None if no guard pins it (checked
    on every call). ``contiguous``: its host layout is C-contiguous (pinned by Dynamo's
    tensor guard). ``dtype``: the buffer's numpy dtype (the slot dtype for a bank input).
    """

    index: int
    buffer: str
    placement: Placement
    dtype: str
    aligned: bool | None = None
    contiguous: bool = False

    @property
    def is_tensor(self) -> bool:
        return self.placement is not Placement.BANK


@dataclass(frozen=True)
class ProgramSpec:
    """A compiled graph, ready to be loaded onto a device. ``alignment`` (bytes) is the
    device alignment the inputs' facts and the memory plan are made for. ``symbols``: the
    size symbols its sizes name and where a call's values are read (empty for a graph
    of static shapes); ``example_sizes``: their values while tracing; ``plan_sizes``:
    see below."""

    name: str
    buffers: Mapping[str, BufferDecl]
    steps: tuple[Step, ...]
    inputs: tuple[InputPlan, ...]
    constants: Mapping[str, np.ndarray]
    outputs: tuple[OutputDecl | None, ...]
    alignment: int
    symbols: tuple[SymbolSource, ...] = ()
    example_sizes: tuple[int, ...] = ()
    #: static-shape mode: the sizes memory is planned for (each symbol's bucket upper
    #: bound), used for every call whose buffers fit; empty: plan per size tuple
    plan_sizes: tuple[int, ...] = ()
    #: the graph's input mutations: the last ``len(writebacks)`` outputs are the new
    #: values of these inputs (argument indices), copied back into the caller's tensors
    writebacks: tuple[int, ...] = ()
    #: (condition, message) of each runtime assertion on sizes: a size expression that
    #: must be nonzero at every size tuple a call brings (checked once per new tuple)
    size_asserts: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for plan in self.inputs:
            if plan.buffer not in self.buffers:
                raise SimAccelError(f"{self.name}: input {plan.index} names an unknown "
                                    f"buffer {plan.buffer!r}")

    @property
    def mapped_updates(self) -> dict[str, int]:
        """Buffer -> argument index of each input its kernel updates in host memory."""
        return {p.buffer: p.index for p in self.inputs_placed(Placement.MAPPED_UPDATE)}

    def inputs_placed(self, *placements: Placement) -> tuple[InputPlan, ...]:
        """The input plans with one of ``placements``, in argument order."""
        return tuple(p for p in self.inputs if p.placement in placements)

"""The callable a compiled graph becomes: host tensors in, device program, host tensors out."""
from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.fx

from simaccel.address_call import AddressCall, bump_version
from simaccel.codegen import compile_pool
from simaccel.codegen.ir import contiguous_strides, dense_strides
from simaccel.codegen.size_args import runtime_size, runtime_sizes
from simaccel.codegen.sizes import is_symbolic
from simaccel.guards import dynamo
from simaccel.host_args import (HostArrays, StaticViews, content_key, next_version_key,
                                numpy_view, writeback_view_of)
from simaccel.runtime.address import address_replay
from simaccel.runtime.direct import DirectReplay, direct_possible, direct_replay
from simaccel.runtime.layout import MAX_LAYOUTS
from simaccel.runtime.program import Program
from simaccel.runtime.sizes import SizeFunction


class CompiledGraph:
    """The callable AOTAutograd runs for one forward or backward graph (boxed calling
    convention: it receives the argument list and clears it)."""

    _boxed_call = True

    def __init__(self, program: Program, output_meta: list[Any], host_outputs: dict[int, Any],
                 report: Any = None, static_inputs: frozenset[int] = frozenset(),
                 version_bumped: frozenset[int] | None = None,
                 tensor_sizes_vary: bool = True):
        self.program = program
        #: whether a tensor argument's sizes or strides can differ between calls (some
        #: are size symbols; True where that is not known); else Dynamo's tensor guards
        #: pinned them all, and a call re-checks none (a lifted int is a size symbol of
        #: its own)
        self._sizes_vary = tensor_sizes_vary
        self.output_meta = output_meta
        #: outputs the program does not compute: Python values, and graph inputs returned
        #: as they are (an ``(args) -> value`` callable)
        self.host_outputs = host_outputs
        #: (shape, stride, dtype) of each tensor output the program writes, else None;
        #: over dynamic sizes, made per size tuple
        self._outputs = HostOutputs(output_meta, set(host_outputs),
                                    [src.symbol for src in program.spec.symbols])
        #: argument indices kept resident (parameters, static-address tensors): decided at
        #: compile time, in the program's input plans
        self.resident = sorted(program.resident_inputs)
        #: the graph's CompileReport (None for graphs compiled outside the backend)
        self.report = report
        #: argument indices fed to the constant bank (lifted scalars, 0-d inputs): only
        #: the bank reads them, so a Python number or a 0-d tensor is fine there
        self.bank_inputs = frozenset(program.bank_inputs)
        #: argument indices of the inputs the program writes back (input mutations)
        self._writebacks = program.spec.writebacks
        #: those a kernel updates in the caller's memory itself: no write-back view
        self._updated = program.mapped_updates
        #: host views of the static-address inputs (parameters, optimizer state), kept
        #: between calls; the 0-d inputs the bank reads by value are never kept
        static = static_inputs - self.bank_inputs
        self._static = StaticViews(static, self._sizes_vary) if static else None
        #: resident inputs without a kept view: their content key is made on its own
        #: (the others' comes with their view, in the same pass over the arguments)
        self._unkept_resident = [i for i in self.resident if i not in static]
        #: static-address 0-d inputs the bank reads by value and the graph updates in
        #: place (an optimizer's step counts): their write-back views, kept as
        #: (tensor, data address, view) by index
        self._static_scalars = static_inputs & self.bank_inputs
        self._kept_writebacks: dict[int, tuple] = {}
        #: the per-call host array conversion for this graph's argument positions
        self._host_arrays: HostArrays | None = None
        #: written-back inputs whose version this graph increments after the call, as an
        #: in-place op does in eager (AOTAutograd increments the others, before the call;
        #: ``version_bumped``), so every resident copy elsewhere sees the change
        self._bumped_after = tuple(i for i in self._writebacks if version_bumped is not None
                                   and i not in version_bumped)
        #: resident inputs the program writes in place: their device copy is the new value
        #: after a call, still valid at the next if their version moved by that one bump
        self._resident_written = program.resident_written
        #: every output a tensor the program writes, no resident input and no input
        #: write-back: a call is the arrays in, the outputs made, the program run (a
        #: pointwise or inference graph on activations; ~0.5 us less per call)
        self._plain = not (self.resident or self._writebacks or host_outputs) \
            and self._outputs.all_tensors
        #: the program's direct replay (:mod:`simaccel.runtime.direct`) and the download
        #: making this graph's outputs from its device views, once a plain call's binding
        #: recorded one; None before, and again after a call it did not fit (the next
        #: general call looks for the binding of its own sizes)
        self._direct: DirectReplay | None = None
        self._direct_download: Callable[[list[Any]], None] | None = None
        #: whether a direct replay can apply at all (else none is looked for)
        self._direct_possible = self._plain and direct_possible(program)
        #: the steady call by data addresses (:mod:`simaccel.address_call`) once a call's
        #: binding recorded its replay; None before, and after a call it did not fit
        self._address_call: AddressCall | None = None
        #: whether one can apply: a static-shape graph whose resident inputs it never
        #: writes, every input mutation updated in place by its kernel (a plain graph has
        #: its direct replay instead)
        self._address_possible = not (self._sizes_vary or self._plain
                                      or self._resident_written) \
            and set(self._writebacks) <= set(self._updated)
        #: general calls to make before looking for an address call again, and the next
        #: such wait: an address call that did not fit its very next call (resident
        #: weights an optimizer changes every step) is looked for again after 1, 3, 7 ...
        #: 63 general calls, so finding it costs a training step nearly nothing
        self._address_wait = self._address_backoff = 0

    def __call__(self, args: list[Any]) -> list[Any]:
        address_call = self._address_call
        if address_call is not None:
            outputs = address_call(args)
            if outputs is not None:
                args.clear()
                return outputs
            self._address_missed(address_call)  # the general call below
        host_arrays = self._host_arrays
        if host_arrays is None or host_arrays.count != len(args):
            return self._first_call(args)
        keys: dict[int, Any] | None = {} if self.resident else None
        host_args, data_ptrs = host_arrays(args, keys)
        return self._run(args, host_args, data_ptrs, keys, self.program.layout_for(host_args))

    def _run(self, args: list[Any], host_args: list[Any], data_ptrs: list[int],
             keys: dict[int, Any] | None, layout: Any) -> list[Any]:
        """The general call on ``args`` (their host arrays and data addresses, the
        content keys of resident inputs, the layout of their sizes made already)."""
        makers, scalars = self._outputs.at(layout.sizes)
        if self._plain:
            outputs = [make() for make in makers]
            self.program.run(host_args, [numpy_view(o) for o in outputs], None, data_ptrs,
                             layout)
            args.clear()
            if self._direct is None and self._direct_possible:
                self._find_direct(makers, layout)
            return outputs
        for i in self._unkept_resident:
            keys[i] = content_key(args[i])  # type: ignore[index]
        outputs = [None if make is None else make() for make in makers]
        hosts = [None if o is None else numpy_view(o) for o in outputs]
        if self._writebacks:
            hosts += [None if i in self._updated else
                      self._writeback_view(i, args[i], host_args[i]) for i in self._writebacks]
        after = {i: next_version_key(keys[i]) for i in self._resident_written} \
            if self._resident_written else None  # type: ignore[index]
        self.program.run(host_args, hosts, keys, data_ptrs, layout, after)
        for i in self._bumped_after:
            bump_version(args[i])
        for index, value in self.host_outputs.items():
            outputs[index] = value(args) if callable(value) else scalars.get(index, value)
        if self._address_possible and self._address_call is None:
            self._find_address_call(args, outputs, makers, scalars, layout)
        args.clear()
        return outputs

    def _find_address_call(self, args: list[Any], outputs: list[Any], makers: list[Any],
                           scalars: dict[int, Any], layout: Any) -> None:
        """Take the program's address replay at ``layout`` if its binding recorded one
        and calls like this one (``args``, ``outputs``) fit it."""
        if self._address_wait:
            self._address_wait -= 1
            return
        found = address_replay(self.program, layout)
        if found is not None and AddressCall.fits(found, args, outputs):
            self._address_call = AddressCall(found, args, makers, scalars,
                                             self.host_outputs, self.bank_inputs,
                                             self._bumped_after, self.resident)

    def _address_missed(self, call: AddressCall) -> None:
        """Leave the address call that did not fit a call; wait longer before looking
        for the next one if it fitted none."""
        self._address_call = None
        self._address_backoff = 0 if call.served else min(2 * self._address_backoff + 1,
                                                          ADDRESS_WAIT_MAX)
        self._address_wait = self._address_backoff

    def _first_call(self, args: list[Any]) -> list[Any]:
        """The first call (or one with another argument count): sorts the argument
        positions, then calls; the kernels it ran in tier 0 start compiling when it
        returns (:func:`~simaccel.codegen.compile_pool.release_deferred`)."""
        self._host_arrays = HostArrays(len(args), self.bank_inputs, self._static,
                                       self._sizes_vary)
        try:
            return self(args)
        finally:
            compile_pool.release_deferred()

    def _writeback_view(self, index: int, t: Any, host: Any) -> np.ndarray:
        """The array an input mutation of ``t`` is copied into: kept with the input's
        static view (parameters, optimizer state: the same memory every call), made per
        call for any other input."""
        static = self._static
        if static is not None and index in static.indices:
            return static.writeback_view(index, t, host)
        kept = self._kept_writebacks.get(index)
        if kept is not None and kept[0] is t and kept[1] == t.data_ptr():
            return kept[2]
        view = writeback_view_of(t, host)
        if index in self._static_scalars:
            self._kept_writebacks[index] = (t, t.data_ptr(), view)
        return view

    def call_unboxed(self, *args: Any) -> list[Any]:
        """Dynamo's calling convention (positional arguments), for graphs Dynamo calls
        directly, without AOTAutograd's runtime wrapper. A steady call of a plain graph
        goes the direct way (:meth:`_find_direct`): ~2.5 us less."""
        direct = self._direct
        if direct is None or len(args) != self._host_arrays.count:  # type: ignore[union-attr]
            return self(list(args))
        host_args, data_ptrs = self._host_arrays(args)  # type: ignore[misc]
        layout = self.program.layout_for(host_args)
        outputs = direct(host_args, data_ptrs, layout, self._direct_download)  # type: ignore
        if outputs is not None:
            return outputs
        # another binding, or the state changed: the general call (binding it again); the
        # views go, with the device memory they hold
        self._direct = self._direct_download = None
        return self._run(list(args), host_args, data_ptrs, None, layout)

    def _find_direct(self, makers: list[Callable[[], torch.Tensor]], layout: Any) -> None:
        """Take the program's direct replay at ``layout``, if that binding recorded its
        replay and its outputs can be made as clones of their device views: each output
        in the layout :class:`HostOutputs` makes (contiguous, no storage offset), so a
        clone is what the general call makes."""
        direct = direct_replay(self.program, layout)
        if direct is None:
            return  # no record yet
        views = []
        for make, src in zip(makers, direct.sources()):
            view = _torch_view(src, make())
            if view is None:
                self._direct_possible = False
                return
            views.append(view)
        clones = tuple(views)

        def download(outputs: list[Any]) -> None:
            outputs.extend(map(_CLONE, clones))
        self._direct, self._direct_download = direct, download


#: the most general calls a graph waits before looking for an address call again
ADDRESS_WAIT_MAX = 63


def direct_caller(compiled: Any, held: tuple[torch.Tensor, ...] = (),
                  bumped: tuple[int, ...] = ()) -> Callable[..., list[Any]]:
    """What Dynamo calls in place of AOTAutograd's runtime wrapper around ``compiled`` (a
    boxed graph callable with ``call_unboxed``): its arguments with the frame module's
    ``held`` tensors first, after incrementing the version of the inputs at ``bumped``
    (graph positions), as the wrapper does (:class:`simaccel.guards.dynamo.DirectCall`)."""
    if not held and not bumped:
        return compiled.call_unboxed
    # the bumped inputs in one C-level lookup: a tensor, or a tuple of them, either of
    # which increment_version takes
    pick = operator.itemgetter(*bumped) if bumped else None
    increment_version = torch.autograd.graph.increment_version

    def call(*args: Any) -> list[Any]:
        full = [*held, *args]
        if pick is not None:
            increment_version(pick(full))
        return compiled(full)
    return call


#: a tensor's copy in new memory of its own layout, as a C-level function for ``map``
_CLONE = torch.Tensor.clone


def _torch_view(src: np.ndarray, host: torch.Tensor) -> torch.Tensor | None:
    """A tensor over device view ``src`` whose clone has ``host``'s shape, strides and
    dtype (a bfloat16 output's device view holds its int16 storage view); None if a clone
    cannot give that layout."""
    if host.storage_offset() or not host.is_contiguous() or not src.flags.c_contiguous:
        return None
    view = torch.from_numpy(src)
    if view.dtype != host.dtype:
        if view.element_size() != host.element_size():
            return None
        view = view.view(host.dtype)
    return view if view.shape == host.shape else None


class HostOutputs:
    """How the host outputs of a call are allocated: (shape, stride, dtype) per tensor
    output, like eager's (its strides when they are dense, contiguous otherwise), and the
    value of each symbolic int output. Over dynamic sizes the traced metadata's size
    expressions are evaluated once per size tuple (:mod:`simaccel.runtime.sizes`)."""

    def __init__(self, metas: list[Any], skip: set[int], symbols: list[str]):
        self._metas = [None if k in skip or not isinstance(m, torch.Tensor) else m
                       for k, m in enumerate(metas)]
        exprs: list[Any] = []
        for m in self._metas:
            if m is not None:
                exprs += [*runtime_sizes(m.shape), *runtime_sizes(m.stride()),
                          runtime_size(m.storage_offset())]
        self._scalar_outputs = [k for k, m in enumerate(metas)
                                if k in skip and isinstance(m, torch.SymInt) and is_symbolic(m)]
        exprs += [runtime_size(metas[k]) for k in self._scalar_outputs]
        self._evaluate = SizeFunction(symbols, exprs)
        self._cache: dict[tuple[int, ...], tuple[list, dict[int, int]]] = {}
        #: every output is a tensor the program writes (a maker for each)
        self.all_tensors = all(m is not None for m in self._metas)

    def at(self, sizes: tuple[int, ...]) -> tuple[list[Callable[[], torch.Tensor] | None],
                                                  dict[int, int]]:
        """A maker of each tensor output at ``sizes`` (a zero-argument call allocating it:
        :func:`_output_maker`) and the symbolic int outputs (cached by the symbols they
        read: an int only kernels read shares them across its values)."""
        key = self._evaluate.key(sizes)
        found = self._cache.get(key)
        if found is None:
            if len(self._cache) >= MAX_LAYOUTS:
                self._cache.pop(next(iter(self._cache)))
            found = self._cache[key] = self._make(iter(self._evaluate(sizes)))
        return found

    def _make(self, values: Any) -> tuple[list[Callable[[], torch.Tensor] | None],
                                          dict[int, int]]:
        makers: list[Callable[[], torch.Tensor] | None] = []
        for meta in self._metas:
            if meta is None:
                makers.append(None)
                continue
            shape = tuple(next(values) for _ in meta.shape)
            stride = tuple(next(values) for _ in meta.shape)
            offset = next(values)
            if not dense_strides(shape, stride):
                stride = contiguous_strides(shape)
            makers.append(_output_maker(shape, stride, meta.dtype, offset))
        return makers, {k: next(values) for k in self._scalar_outputs}


def _output_maker(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype,
                  offset: int) -> Callable[[], torch.Tensor]:
    """A zero-argument call making a new host output (:func:`_new_output`), its arguments
    bound once: ~1.4 us cheaper per output and call than unpacking them every call."""
    if not offset:
        return functools.partial(torch.empty_strided, shape, stride, dtype=dtype)
    return functools.partial(_new_output, shape, stride, dtype, offset)


def _new_output(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype,
                offset: int) -> torch.Tensor:
    """A host output with eager's layout, its storage offset included: AOTAutograd
    regenerates an output that aliases an input (``x.add_(1)`` returned, a view of a
    synthetic base) as a view of that input with this tensor's size, stride and offset."""
    if not offset:
        return torch.empty_strided(shape, stride, dtype=dtype)
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else 0
    return torch.empty(offset + extent, dtype=dtype).as_strided(shape, stride, offset)


def graph_outputs(gm: torch.fx.GraphModule, input_views: dict[int, Any]) -> dict[int, Any]:
    """The outputs the device program does not compute, by output position: Python
    values (ints, SymInts, None), graph inputs the graph returns as they are (a saved
    parameter of a training graph: returned without a copy, as eager returns it, so the
    backward graph gets the parameter itself and keeps it resident), and views of inputs
    (``input_views``, the lowering's: replayed on the caller's tensor)."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    flat = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    result: dict[int, Any] = {}
    for index, node in enumerate(flat):
        meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else node
        if isinstance(node, torch.fx.Node) and node in placeholders:
            pos = placeholders.index(node)
            result[index] = lambda args, pos=pos: args[pos]
        elif isinstance(meta, torch.Tensor):
            continue  # computed by the program
        elif isinstance(meta, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            result[index] = _concrete(meta)
        else:
            result[index] = meta
    result.update(input_views)  # t(weight) saved for the backward, ...
    return result


def _concrete(value: Any) -> Any:
    hint = dynamo.size_hint(value)
    return value if hint is None else hint

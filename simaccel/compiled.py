"""The callable a compiled graph becomes: host tensors in, device program, host tensors out."""
from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
import torch.fx

from simaccel.codegen import compile_pool
from simaccel.codegen.dtypes import (BANK_TORCH_DTYPES, NUMPY_TORCH_DTYPES,
                                     PLAIN_HALF_TORCH_DTYPES, PLAIN_TORCH_DTYPES, byte_view)
from simaccel.codegen.ir import contiguous_strides, dense_strides
from simaccel.codegen.size_args import runtime_size, runtime_sizes
from simaccel.codegen.sizes import is_symbolic
from simaccel.errors import SimAccelError
from simaccel.guards import dynamo
from simaccel.runtime.layout import MAX_LAYOUTS
from simaccel.runtime.program import Program
from simaccel.runtime.sizes import SizeFunction


class CompiledGraph:
    """The callable AOTAutograd runs for one forward or backward graph (boxed calling
    convention: it receives the argument list and clears it)."""

    _boxed_call = True

    def __init__(self, program: Program, output_meta: list[Any], host_outputs: dict[int, Any],
                 report: Any = None, static_inputs: frozenset[int] = frozenset(),
                 version_bumped: frozenset[int] | None = None):
        self.program = program
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
        self._static = StaticViews(static, bool(program.spec.symbols)) if static else None
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

    def __call__(self, args: list[Any]) -> list[Any]:
        host_arrays = self._host_arrays
        if host_arrays is None or host_arrays.count != len(args):
            return self._first_call(args)
        keys: dict[int, Any] | None = {} if self.resident else None
        host_args, data_ptrs = host_arrays(args, keys)
        layout = self.program.layout_for(host_args)
        makers, scalars = self._outputs.at(layout.sizes)
        if self._plain:
            outputs = [make() for make in makers]
            self.program.run(host_args, [_numpy_view(o) for o in outputs], None, data_ptrs,
                             layout)
            args.clear()
            return outputs
        for i in self._unkept_resident:
            keys[i] = _content_key(args[i])  # type: ignore[index]
        outputs = [None if make is None else make() for make in makers]
        hosts = [None if o is None else _numpy_view(o) for o in outputs]
        if self._writebacks:
            hosts += [None if i in self._updated else
                      self._writeback_view(i, args[i], host_args[i]) for i in self._writebacks]
        after = {i: _next_version_key(keys[i]) for i in self._resident_written} \
            if self._resident_written else None  # type: ignore[index]
        self.program.run(host_args, hosts, keys, data_ptrs, layout, after)
        for i in self._bumped_after:
            _bump_version(args[i])
        for index, value in self.host_outputs.items():
            outputs[index] = value(args) if callable(value) else scalars.get(index, value)
        args.clear()
        return outputs

    def _first_call(self, args: list[Any]) -> list[Any]:
        """The first call (or one with another argument count): sorts the argument
        positions, then calls; the kernels it ran in tier 0 start compiling when it
        returns (:func:`~simaccel.codegen.compile_pool.release_deferred`)."""
        self._host_arrays = HostArrays(len(args), self.bank_inputs, self._static,
                                       bool(self.program.spec.symbols))
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
        view = _writeback_view(t, host)
        if index in self._static_scalars:
            self._kept_writebacks[index] = (t, t.data_ptr(), view)
        return view

    def call_unboxed(self, *args: Any) -> list[Any]:
        """Dynamo's calling convention (positional arguments), for graphs Dynamo calls
        directly, without AOTAutograd's runtime wrapper."""
        return self(list(args))


def direct_caller(compiled: Any, held: tuple[torch.Tensor, ...] = (),
                  bumped: tuple[int, ...] = ()) -> Callable[..., list[Any]]:
    """What Dynamo calls in place of AOTAutograd's runtime wrapper around ``compiled`` (a
    boxed graph callable with ``call_unboxed``): its arguments with the frame module's
    ``held`` tensors first, after incrementing the version of the inputs at ``bumped``
    (graph positions), as the wrapper does (:class:`simaccel.guards.dynamo.DirectCall`)."""
    if not held and not bumped:
        return compiled.call_unboxed
    held_list = list(held)

    def call(*args: Any) -> list[Any]:
        full = held_list + list(args)
        if bumped:
            torch.autograd.graph.increment_version(tuple(full[i] for i in bumped))
        return compiled(full)
    return call


def _content_key(t: torch.Tensor) -> tuple:
    """Identifies a tensor's current contents as (memory, version): the same object,
    storage, sizes and strides is the same memory, and its version counter moves with
    every in-place update (so the device copy of an unchanged key is still valid)."""
    return ((id(t), t.data_ptr(), tuple(t.shape), tuple(t.stride())), t._version)


#: tokens naming one kept static view (a tensor at one address, sizes and strides)
_VIEW_TOKENS = itertools.count()


class StaticViews:
    """Host views of the tensors a graph takes at ``indices`` whose address Dynamo pins
    (parameters, optimizer state): made at a tensor's first call and kept. The same
    tensor object at the same address with the same sizes and strides is the same memory,
    so its view is reused instead of made per call (~2 us a tensor: an optimizer step
    takes four tensors per parameter), and so are its write-back view and the memory part
    of its content key (a token). The views hold their tensors alive while the graph
    lives, as its guards already do."""

    def __init__(self, indices: Iterable[int], dynamic: bool = True):
        self.indices = frozenset(indices)
        #: index -> [tensor, data address, sizes, strides, view, token, write-back view]
        self._kept: dict[int, list] = {}
        #: False for a static-shape graph: Dynamo's tensor guards already checked every
        #: input's sizes and strides before the call, so a kept view is looked up by
        #: tensor and address alone (an optimizer step takes 20-40 such tensors)
        self._dynamic = dynamic

    def host_array(self, index: int, t: Any) -> tuple[Any, int]:
        """(host array, data address) of ``t``, the input at ``index`` (its kept view, or
        a new one if another tensor, address, size or strides came)."""
        host: dict[int, Any] = {}
        ptrs: dict[int, int] = {}
        self.host_arrays([index], {index: t}, host, ptrs)
        return host[index], ptrs[index]

    def host_arrays(self, indices: list[int], args: Any, host: Any, ptrs: Any,
                    keys: dict[int, Any] | None = None) -> None:
        """:meth:`host_array` of ``args[i]`` into ``host[i]`` and ``ptrs[i]`` for each of
        ``indices``, and, given ``keys``, its :meth:`content_key` into ``keys[i]`` (a kept
        view found inline: this runs for every static input of every call; a GPT-2 call
        takes 80 parameters, one pass over them instead of two saved ~15 us)."""
        kept_views = self._kept
        dynamic = self._dynamic
        for i in indices:
            t = args[i]
            kept = kept_views.get(i)
            if kept is not None and kept[0] is t:
                ptr = t.data_ptr()
                if kept[1] == ptr and (not dynamic or (kept[2] == t.shape
                                                       and kept[3] == t.stride())):
                    host[i], ptrs[i] = kept[4], ptr
                    if keys is not None:
                        keys[i] = (kept[5], t._version)
                    continue
            host[i], ptrs[i] = self._keep(i, t)
            if keys is not None and isinstance(t, torch.Tensor):
                keys[i] = self.content_key(i, t)

    def _keep(self, index: int, t: Any) -> tuple[Any, int]:
        """A new view of ``t`` at ``index``, kept for the next calls (a tensor)."""
        if not isinstance(t, torch.Tensor):
            return _host_array(t), 0
        ptr = t.data_ptr()
        view = _host_array(t)
        self._kept[index] = [t, ptr, t.shape, t.stride(), view, next(_VIEW_TOKENS), None]
        return view, ptr

    def content_key(self, index: int, t: Any) -> tuple:
        """(token, version) of ``t``, whose view :meth:`host_array` kept this call."""
        kept = self._kept.get(index)
        if kept is None or kept[0] is not t:
            return _content_key(t)
        return (kept[5], t._version)

    def writeback_view(self, index: int, t: Any, host: Any) -> np.ndarray:
        """The write-back view of ``t`` (``host``: its host array this call), kept."""
        kept = self._kept.get(index)
        if kept is None or kept[0] is not t:
            return _writeback_view(t, host)
        if kept[6] is None:
            kept[6] = _writeback_view(t, host)
        return kept[6]


def _next_version_key(key: tuple) -> tuple:
    """The content key a tensor written by this call has at the next call when nothing
    else touched it: one version later (:attr:`CompiledGraph._bumped_after`)."""
    return (key[0], key[1] + 1)


def _bump_version(t: Any) -> None:
    if isinstance(t, torch.Tensor) and not t.is_inference():
        torch.autograd.graph.increment_version(t)


class HostArrays:
    """Host arrays of a graph's ``count`` arguments (Python values pass through) and each
    tensor's data address (bytes; 0 for non-tensors), for the program's DMA alignment
    check. This runs on every call, so the positions are sorted once by what they hold:
    the kept views of static-address inputs (``static``); the constant bank's
    (``scalar_indices``: a 0-d tensor there, a lifted float Dynamo wraps per call, only
    feeds the bank, which packs its value, so it is passed as that Python number:
    ``item()`` is exact for every dtype the bank holds and ~1 us cheaper than a numpy
    view); and the rest, plain CPU tensors in the common case (a numpy view). Anything
    else at any position takes the general conversion."""

    def __init__(self, count: int, scalar_indices: frozenset[int] = frozenset(),
                 static: StaticViews | None = None, dynamic: bool = True):
        kept = static.indices if static is not None else frozenset()
        self.count = count
        self._static = static
        self._kept = [i for i in range(count) if i in kept]
        self._bank = [i for i in range(count) if i in scalar_indices and i not in kept]
        self._plain = [i for i in range(count) if i not in kept and i not in scalar_indices]
        #: index -> (tensor, data address, view, sizes, strides) of the last small plain
        #: input there (:data:`KEEP_VIEW_MAX_BYTES`)
        self._small: dict[int, tuple] = {}
        #: whether sizes can change between calls (else Dynamo's guards pinned them)
        self._dynamic = dynamic

    def __call__(self, args: list[Any], keys: dict[int, Any] | None = None
                 ) -> tuple[list[Any], list[int]]:
        """(host arrays, data addresses) of ``args``; ``keys``, if given, receives the
        content key of every kept static view (:meth:`StaticViews.host_arrays`)."""
        host = list(args)  # Python numbers (lifted scalars Dynamo passed) stay as they are
        ptrs = [0] * len(args)
        small = self._small
        for i in self._plain:
            a = args[i]
            kept = small.get(i)
            if kept is not None and kept[0] is a and kept[1] == a.data_ptr() and (
                    not self._dynamic or (kept[3] == a.shape and kept[4] == a.stride())):
                host[i], ptrs[i] = kept[2], kept[1]
            elif type(a) is torch.Tensor and not a.requires_grad \
                    and a.dtype in PLAIN_TORCH_DTYPES:
                host[i] = a.numpy()
                ptrs[i] = a.data_ptr()
                if a.nbytes <= KEEP_VIEW_MAX_BYTES:
                    small[i] = (a, ptrs[i], host[i], a.shape, a.stride())
            elif type(a) is torch.Tensor and not a.requires_grad \
                    and a.dtype in PLAIN_HALF_TORCH_DTYPES:  # mixed-precision activations
                host[i] = byte_view(a).numpy()
                ptrs[i] = a.data_ptr()
            elif not _is_number(a):
                host[i], ptrs[i] = _general_host_array(a)
        if self._kept:
            self._static.host_arrays(self._kept, args, host, ptrs,  # type: ignore[union-attr]
                                     keys)
        for i in self._bank:
            a = args[i]
            if type(a) is torch.Tensor and a.dim() == 0 and a.dtype in BANK_TORCH_DTYPES:
                host[i] = a.item()
            elif not _is_number(a):
                host[i], ptrs[i] = _general_host_array(a)
        return host, ptrs


#: a plain per-call tensor input of at most this many bytes keeps its host view until
#: the next call at its position: the same tensor object at the same address (an
#: optimizer's gradient, a model's fixed mask) is the same memory, so its view is reused
#: (~1 us a tensor less). Small, because the kept view holds the tensor's memory one
#: call longer.
KEEP_VIEW_MAX_BYTES = 64 << 10


def _is_number(value: Any) -> bool:
    kind = type(value)
    return kind is float or kind is int or kind is bool


def _general_host_array(value: Any) -> tuple[Any, int]:
    """(host array, data address) of any argument (see :func:`_host_array`)."""
    return _host_array(value), value.data_ptr() if isinstance(value, torch.Tensor) else 0


def _host_array(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.dtype in NUMPY_TORCH_DTYPES and t.device.type == "cpu" \
                and not (t.is_conj() or t.is_neg()):
            return t.numpy()  # the common case, kept short: this runs for every input
        if t.device.type != "cpu":
            raise TypeError(f"simaccel takes CPU tensors as host inputs, got {t.device}")
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        return byte_view(t).numpy()
    if value is None:  # an erased effect token (with_effects graphs): an empty input
        return _NO_DATA
    return value


#: the host array of an input passed as None (AOTAutograd erases effect tokens at runtime)
_NO_DATA = np.empty(0, dtype=np.float32)


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


def _writeback_view(t: torch.Tensor, host: Any) -> np.ndarray:
    """A writable numpy view of the caller's tensor ``t`` (its own memory, its strides),
    which the program copies an input mutation's new value into: ``host``, its host
    array, where that is a view of ``t`` (a tensor input's is, unless conj/neg bits made
    it a resolved copy; a 0-d bank input's is a Python number)."""
    if isinstance(host, np.ndarray) and isinstance(t, torch.Tensor) and not t.is_neg() \
            and not t.is_conj():
        return host  # a parameter's too: its host array is a view of its detached self
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.is_conj() \
            or t.is_neg():
        raise SimAccelError(f"simaccel writes a graph's input mutation back into a plain CPU "
                            f"tensor, got {type(t).__name__} "
                            f"{getattr(t, 'device', '')}; pass CPU tensors")
    return _numpy_view(t.detach())


def _numpy_view(t: torch.Tensor) -> np.ndarray:
    return t.numpy() if t.dtype in NUMPY_TORCH_DTYPES else byte_view(t).numpy()


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

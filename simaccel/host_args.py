"""How a compiled graph's call arguments become what the device program takes: host
arrays (numpy views of the caller's tensors, no copy), their data addresses, and the
content keys of resident inputs. This runs on every call, so the views of tensors that
come again (parameters, optimizer state, a gradient) are kept between calls."""
from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from simaccel.codegen.dtypes import (BANK_TORCH_DTYPES, NUMPY_TORCH_DTYPES,
                                     PLAIN_HALF_TORCH_DTYPES, PLAIN_TORCH_DTYPES, byte_view)
from simaccel.errors import SimAccelError
from simaccel.runtime.replay import REMEMBER_MAX_BYTES


def content_key(t: torch.Tensor) -> tuple:
    """Identifies a tensor's current contents as (memory, version): the same object,
    storage, sizes and strides is the same memory, and its version counter moves with
    every in-place update (so the device copy of an unchanged key is still valid)."""
    return ((id(t), t.data_ptr(), tuple(t.shape), tuple(t.stride())), t._version)


#: tokens naming one kept static view (a tensor at one address, sizes and strides)
_VIEW_TOKENS = itertools.count()
#: a tensor's data address and version counter, as C-level functions for ``map``
_DATA_PTR = torch.Tensor.data_ptr
_VERSION = operator.attrgetter("_version")


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
        #: (indices, tensors, data addresses, views, tokens) of the last call that found
        #: or kept a view for every index (static-shape graphs; :meth:`_same_as_last`)
        self._last: tuple[list[int], list, list[int], list, list[int]] | None = None

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
        if not self._dynamic and self._same_as_last(indices, args, host, ptrs, keys):
            return
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
        if not dynamic and len(indices) == len(self.indices):
            self._remember(indices, args)

    def _same_as_last(self, indices: list[int], args: Any, host: Any, ptrs: Any,
                      keys: dict[int, Any] | None) -> bool:
        """The per-index loop of :meth:`host_arrays` in bulk, for a call passing the very
        tensors of the last one at the same addresses (a model's parameters, call after
        call): checked and filled by C-level maps, which touch fewer Python objects (a
        GPT-2 call takes 82 parameters, right after kernels that evicted the caches).
        False, having filled nothing, for any other call."""
        last = self._last
        if last is None or last[0] is not indices:
            return False
        tensors = list(map(args.__getitem__, indices))
        if not all(map(operator.is_, tensors, last[1])):
            return False
        addresses = list(map(_DATA_PTR, tensors))
        if addresses != last[2]:
            return False
        for i, view, ptr in zip(indices, last[3], addresses):
            host[i] = view
            ptrs[i] = ptr
        if keys is not None:
            keys.update(zip(indices, zip(last[4], map(_VERSION, tensors))))
        return True

    def _remember(self, indices: list[int], args: Any) -> None:
        """Keep what :meth:`_same_as_last` compares the next call with (None unless every
        index holds its kept tensor)."""
        kept = [self._kept.get(i) for i in indices]
        if any(k is None or k[0] is not args[i] for k, i in zip(kept, indices)):
            self._last = None
            return
        self._last = (indices, [k[0] for k in kept], [k[1] for k in kept],
                      [k[4] for k in kept], [k[5] for k in kept])

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
            return content_key(t)
        return (kept[5], t._version)

    def writeback_view(self, index: int, t: Any, host: Any) -> np.ndarray:
        """The write-back view of ``t`` (``host``: its host array this call), kept."""
        kept = self._kept.get(index)
        if kept is None or kept[0] is not t:
            return writeback_view_of(t, host)
        if kept[6] is None:
            kept[6] = writeback_view_of(t, host)
        return kept[6]


def next_version_key(key: tuple) -> tuple:
    """The content key a tensor written by this call has at the next call when nothing
    else touched it: one version later (:attr:`CompiledGraph._bumped_after`)."""
    return (key[0], key[1] + 1)


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
            if kept is not None:
                if kept[0] is a and kept[1] == a.data_ptr() and (
                        not self._dynamic or (kept[3] == a.shape and kept[4] == a.stride())):
                    host[i], ptrs[i] = kept[2], kept[1]
                    continue
                del small[i]  # another tensor came: the old one is not held any longer
            if type(a) is torch.Tensor and not a.requires_grad \
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
            kind = type(a)
            if kind is float or kind is int or kind is bool:
                continue  # a lifted scalar Dynamo passed as a Python number
            if kind is torch.Tensor and a.dim() == 0 and a.dtype in BANK_TORCH_DTYPES:
                host[i] = a.item()
            else:
                host[i], ptrs[i] = _general_host_array(a)
        return host, ptrs


#: a plain per-call tensor input of at most this many bytes keeps its host view until
#: the next call at its position: the same tensor object at the same address (an
#: optimizer's gradient, a model's fixed mask) is the same memory, so its view is reused
#: (~1 us a tensor less). Small, because the kept view holds the tensor's memory one
#: call longer; a replay remembers arrays up to the same size.
KEEP_VIEW_MAX_BYTES = REMEMBER_MAX_BYTES


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
        return NO_DATA
    return value


#: the host array of an input passed as None (AOTAutograd erases effect tokens at runtime)
NO_DATA = np.empty(0, dtype=np.float32)


def writeback_view_of(t: torch.Tensor, host: Any) -> np.ndarray:
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
    return numpy_view(t.detach())


def numpy_view(t: torch.Tensor) -> np.ndarray:
    return t.numpy() if t.dtype in NUMPY_TORCH_DTYPES else byte_view(t).numpy()

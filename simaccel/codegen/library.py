"""Library kernels: device operations that run as one call into a tuned library on
device buffers, instead of generated code.

This is how a real backend runs a GEMM: inductor emits an ``extern_kernels.mm`` call,
a GPU backend a cuBLAS call. Here the library is PyTorch's CPU BLAS on device memory,
so nothing is copied and nothing needs a JIT compile: a 2-D product calls the BLAS
routine ``torch.mm`` calls on the buffers' addresses (:mod:`.blas_launch`), a batched
one ``torch.bmm`` with ``out=`` on tensors viewing them; a large float32 linear layer's
product goes to oneDNN's inner product instead, which is faster there
(:data:`ONEDNN_MIN_MACS`). (numpy's
OpenBLAS was measured too: slower on the MLP shapes, and its thread pool fights torch's
for the cores.) A library kernel is still a
device kernel launch (:class:`~simaccel.codegen.ir.LibraryKernel`): it becomes a
:class:`~simaccel.runtime.spec.LaunchStep`, counts
in ``kernel_launches`` and sits on the compute track with its roofline time. Epilogues
(bias, activation) stay fused in the pointwise kernel that follows, except a bfloat16
linear layer's bias, which the library adds before rounding, and the bias of a linear
layer whose result several kernels read as stored (:class:`GemmBias`).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from simaccel.codegen.blas_launch import blas_launch

#: dtypes the GEMM runs in the BLAS library (others use the matmul template). bfloat16
#: operands go to the library's bfloat16 GEMM (oneDNN: float32 accumulation, the product
#: rounded once, as eager's bfloat16 matmul): on this machine's AVX512-BF16 cores a
#: 64x512 @ 512x2048 product takes 0.5 ms in bfloat16, 2.8 ms in float32.
GEMM_DTYPES = ("float32", "float64", "bfloat16")

#: oneDNN's inner product (``torch.ops.mkldnn._linear_pointwise``, the primitive behind
#: inductor's CPU linear fusion); None in a torch built without oneDNN
_ONEDNN_LINEAR = (torch.ops.mkldnn._linear_pointwise.default
                  if torch.backends.mkldnn.is_available() else None)

#: the smallest float32 linear-layer GEMM (m * k * n multiply-adds) run as oneDNN's inner
#: product instead of MKL's ``torch.mm``. Its fixed cost (~15-20 us a call: the primitive
#: look-up, a new result tensor and the copy into the device buffer) loses on small
#: products and its kernels win on large ones. Measured on the 2-core machine, timeit min
#: of 5, oneDNN over ``mm(out=)`` (``/tmp/prof/gemm_sweep.py`` in the session notes):
#: m64 k256 n256 1.38, m64 k256 n768 1.07, m256 k256 n256 1.08, m64 k256 n1024 0.77,
#: m64 k1024 n256 0.88, m64 k512 n2048 0.81, m64 k2048 n512 0.76, m256 k256 n1024 0.71,
#: m256 k512 n2048 0.68, m8 k2048 n512 0.48.
ONEDNN_MIN_MACS = 1 << 24

#: the smallest such product run as the inner product where the weight is read as stored
#: (no resident operand to keep a reordered copy of: a weight an optimizer changes every
#: step). The primitive then reorders it on every call. Measured inside a training step
#: (MLP 256-512-512-10, batch 64, in-step timers, ``/tmp/s37_gemms.py`` in the session
#: notes): m64 k512 n512 took 260 us against MKL's 212 us, and the backward's MKL
#: products after it ran 10-30 us slower; with caches flushed between calls
#: (``/tmp/s37_dnn2.py``) m64 k512 n512 and m64 k256 n1024 tie MKL (1.01-1.06), from
#: 2 ** 25 multiply-adds it wins (0.81-0.89). A reordered weight wins from 2 ** 24
#: (0.80-0.82 at m64 k512 n512, cold or warm, ``/tmp/s37_dnn3.py``).
ONEDNN_PLAIN_MIN_MACS = 1 << 25

#: oneDNN's reorder of a linear layer's weight into its blocked layout for a given batch
#: (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's freezing pass does to
#: constant weights); the inner product on the reordered weight gives the same bits
_ONEDNN_REORDER = (torch.ops.mkldnn._reorder_linear_weight.default
                   if _ONEDNN_LINEAR is not None else None)

#: launches on a resident weight whose contents did not change before the inner product
#: reads a reordered copy. The reorder costs 2-4 products (290 us for a 2048x512 weight,
#: 680 us for 512x2048; each product on it then saves 100-200 us: 737 against 829-954 us
#: for the MLP's products, median of 5 rounds, ``/tmp/prof/gemm_kn.py`` in the session
#: notes), so a weight an optimizer changes every step is never reordered and one that
#: stays (inference) is from its third product on.
REORDER_AFTER = 2


def _matrices(buf: np.ndarray, offset: int, batch: int, rows: int, cols: int,
              batch_stride: int, transposed: bool) -> np.ndarray:
    """A (batch, rows, cols) view of the flat ``buf`` from element ``offset``: row-major
    matrices, or column-major ones (``transposed``) that BLAS reads without a copy."""
    item = buf.itemsize
    inner = (item, rows * item) if transposed else (cols * item, item)
    return np.ndarray((batch, rows, cols), buf.dtype, buf, offset * item,
                      (batch_stride * item, *inner))


class Gemm:
    """``out[i] = a[i] @ b[i]`` for ``i < batch`` (elements; batch strides may be 0 for a
    broadcast operand); ``out`` is contiguous (batch, m, n) from element 0.

    Called as ``gemm(out, a, b, batch, m, k, n, a_off, a_bs, b_off, b_bs, a_t, b_t)``.
    A program binds each launch once per workspace and size tuple (:meth:`bind`): the
    tensors viewing the device buffers are made then, so a launch is the BLAS call alone
    (making the three views costs ~10-20 us, as much as a small GEMM's own time)."""

    #: a program passes each launch's resident operands to :meth:`bind`
    #: (:func:`~simaccel.runtime.group.bind_launch`): a linear layer's resident weight is
    #: read as a reordered copy once it stops changing (:class:`ResidentWeightLinear`)
    keeps_derived = True
    #: the product is written into the bound output buffer itself and a bound launch
    #: takes another output array by :meth:`GemmLaunch.patch`: an output it writes can
    #: be a host-mapped one (:func:`~simaccel.runtime.hostmap.place_mapped_outputs`)
    writes_output_in_place = True

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        #: the operands' torch dtype where the buffers hold its bits as another numpy
        #: dtype (bfloat16 as int16); None: the buffers' own
        self.dtype = dtype
        self.__qualname__ = "gemm" if dtype is None else f"gemm_{str(dtype)[6:]}"

    def __call__(self, *args: Any) -> None:
        self.bind(*args)()

    def bind(self, out: np.ndarray, a: np.ndarray, b: np.ndarray, batch: int, m: int,
             k: int, n: int, a_off: int, a_bs: int, b_off: int, b_bs: int, a_t: int,
             b_t: int, addresses: Any = None, operands: Any = None) -> Callable[[], Any]:
        """The launch on these buffers as a zero-argument call (``addresses``: unused;
        the tensors keep their arrays, so their memory stays alive while it is bound).
        ``operands``: per buffer, its :class:`~simaccel.runtime.resident.ResidentOperand`
        where it is a resident input no step writes, else None."""
        if m == 0 or n == 0 or batch == 0:
            return _nothing
        params = (batch, m, k, n, a_off, a_bs, b_off, b_bs, a_t, b_t)
        weight = operands[2] if operands is not None else None
        return self._blas(params, (out, a, b), weight is not None) \
            or self._launch(params, (out, a, b), weight)

    def _blas(self, params: tuple[int, ...], arrays: tuple[np.ndarray, ...],
              resident: bool = False) -> Callable[[], Any] | None:
        """The launch by the BLAS routine torch.mm (torch.addmm, with a bias row) calls,
        on the buffers' addresses (:mod:`.blas_launch`), where the product is not
        oneDNN's and the buffers hold their own dtype; else None."""
        _, m, k, n, _, _, _, _, a_t, b_t = params
        if self.dtype is not None or self._inner_product_wins(
                arrays[0].dtype == np.float32, m, k, n, a_t, b_t, resident):
            return None
        return blas_launch(params, arrays)

    def _launch(self, params: tuple[int, ...], arrays: tuple[np.ndarray, ...],
                weight: Any = None) -> GemmLaunch:
        """The launch on ``arrays`` (by argument position: :meth:`_view`)."""
        return GemmLaunch(self, params, [self._view(j, x, params) for j, x in
                                         enumerate(arrays)], weight)

    def call_on(self, tensors: list[torch.Tensor], params: tuple[int, ...],
                weight: Any = None) -> Callable[[], Any]:
        """The launch on ``tensors`` (out, a, b: :meth:`_view`) as a zero-argument call;
        ``weight``: the resident operand of ``b``, or None."""
        o, lhs, rhs = tensors
        batch, m, k, n, _, _, _, _, a_t, b_t = params
        if k == 0:
            return o.zero_
        if batch > 1:
            return functools.partial(torch.bmm, lhs, rhs, out=o)
        if self._inner_product_wins(o.dtype == torch.float32, m, k, n, a_t, b_t,
                                    weight is not None):
            if weight is not None:
                return ResidentWeightLinear(lhs, rhs.t(), o, weight)
            return functools.partial(_inner_product, lhs, rhs.t(), o)
        return functools.partial(torch.mm, lhs, rhs, out=o)

    def operand_spans(self, params: tuple[Any, ...]) -> dict[int, list[tuple[int, int]]] | None:
        """The element ranges ``[start, stop)`` a launch with these ``params`` (the
        step's: ``batch, m, k, n, a_off, a_bs, b_off, b_bs, ...``) reads of its operand
        buffers, by argument position (1: ``a``, 2: ``b``), one range per matrix of the
        batch (each operand matrix is ``rows * cols`` consecutive elements, row- or
        column-major); None where a size is a symbol. The host-mapping rule reads them
        (:func:`simaccel.runtime.hostmap.place_mapped_inputs`)."""
        batch, m, k, n, a_off, a_bs, b_off, b_bs = params[:8]
        if not all(isinstance(v, int) for v in (batch, m, k, n, a_off, a_bs, b_off, b_bs)):
            return None
        return {1: [(a_off + i * a_bs, a_off + i * a_bs + m * k) for i in range(batch)],
                2: [(b_off + i * b_bs, b_off + i * b_bs + k * n) for i in range(batch)]}

    def _inner_product_wins(self, float32: bool, m: int, k: int, n: int, a_t: int,
                            b_t: int, resident: bool = False) -> bool:
        """True if this 2-D product runs as oneDNN's inner product: float32, a row-major
        ``a`` and a column-major ``b`` (a linear layer's ``x @ weight.T``: the weight as
        the primitive takes it), at least :data:`ONEDNN_MIN_MACS` large where ``b`` is a
        resident weight (read as a reordered copy), :data:`ONEDNN_PLAIN_MIN_MACS` where
        it is read as stored."""
        least = ONEDNN_MIN_MACS if resident else ONEDNN_PLAIN_MIN_MACS
        return (_ONEDNN_LINEAR is not None and float32 and not a_t
                and bool(b_t) and m * k * n >= least)

    def _view(self, position: int, array: np.ndarray, params: tuple[int, ...]
              ) -> torch.Tensor:
        """Argument ``position`` (0: out, 1: a, 2: b) of a launch with ``params`` (the
        step's ``batch, m, k, n, a_off, a_bs, b_off, b_bs, a_t, b_t``) as a (batch, rows,
        cols) tensor viewing the flat ``array``; a (rows, cols) one when ``batch`` is 1
        (squeezed in numpy, ~1 us cheaper than in torch)."""
        batch, m, k, n, a_off, a_bs, b_off, b_bs, a_t, b_t = params
        if position == 0:
            view = array[:batch * m * n].reshape(batch, m, n)
        elif position == 1:
            view = _matrices(array, a_off, batch, m, k, a_bs, bool(a_t))
        else:
            view = _matrices(array, b_off, batch, k, n, b_bs, bool(b_t))
        return self._tensor(view[0] if batch == 1 else view)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        """A tensor viewing ``array`` (its bits as :attr:`dtype` where one is set)."""
        t = torch.from_numpy(array)
        return t if self.dtype is None else t.view(self.dtype)


class GemmBias(Gemm):
    """``out = bias + a @ b`` (2-D, ``bias`` a row of ``n`` elements): the library's GEMM
    with a bias epilogue, rounded once (k = 0: the bias). Called as ``gemm(out, a, b,
    bias, 1, m, k, n, a_off, 0, b_off, 0, a_t, b_t)``."""

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        super().__init__(dtype)
        self.__qualname__ += "_bias"

    def bind(self, out: np.ndarray, a: np.ndarray, b: np.ndarray,  # type: ignore[override]
             bias: np.ndarray, batch: int, m: int, k: int, n: int, a_off: int, a_bs: int,
             b_off: int, b_bs: int, a_t: int, b_t: int, addresses: Any = None,
             operands: Any = None) -> Callable[[], Any]:
        if m == 0 or n == 0:
            return _nothing
        params = (1, m, k, n, a_off, 0, b_off, 0, a_t, b_t)
        return self._blas(params, (out, a, b, bias)) or self._launch(params, (out, a, b, bias))

    def _view(self, position: int, array: np.ndarray, params: tuple[int, ...]
              ) -> torch.Tensor:
        """As :meth:`Gemm._view`; position 3: the bias row."""
        if position == 3:
            return self._tensor(array[:params[3]])
        return super()._view(position, array, params)

    def call_on(self, tensors: list[torch.Tensor], params: tuple[int, ...],
                weight: Any = None) -> Callable[[], Any]:
        o, lhs, rhs, row = tensors
        _, m, k, n, _, _, _, _, a_t, b_t = params
        if self._inner_product_wins(o.dtype == torch.float32, m, k, n, a_t, b_t):  # adds bias
            return functools.partial(_inner_product, lhs, rhs.t(), o, row)
        return functools.partial(torch.addmm, row, lhs, rhs, out=o)


class GemmLaunch:
    """A bound launch of a library GEMM (:meth:`Gemm.bind`): its tensors view the bound
    buffers, and :meth:`patch` points one of them at another array, as a CUDA graph's
    kernel node gets new parameters. A host-mapped output is a new host array every call
    (the gradient a training backward's GEMM writes in place): only its view is made
    again (~2 us), not the launch's three (~10-20 us)."""

    __slots__ = ("gemm", "params", "tensors", "weight", "call", "at")

    def __init__(self, gemm: Gemm, params: tuple[int, ...], tensors: list[torch.Tensor],
                 weight: Any = None) -> None:
        self.gemm, self.params, self.tensors, self.weight = gemm, params, tensors, weight
        self.call = gemm.call_on(tensors, params, weight)
        #: argument position -> the data address (bytes) a patch pointed it at
        self.at: dict[int, int] = {}

    def __call__(self) -> None:
        self.call()

    def patch(self, position: int, array: np.ndarray, address: int) -> None:
        """Point buffer argument ``position`` at ``array`` (its data address ``address``,
        bytes), of the dtype and size the launch was bound with (checked by the
        caller)."""
        if self.at.get(position) == address:
            return
        self.at[position] = address
        self.tensors[position] = tensor = self.gemm._view(position, array, self.params)
        repoint = getattr(self.call, "repoint", None)
        if repoint is not None and position < 2:  # its reordered weight stays
            repoint(position, tensor)
            return
        self.call = self.gemm.call_on(self.tensors, self.params, self.weight)


def _inner_product(lhs: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
                   bias: torch.Tensor | None = None) -> None:
    """``out = lhs @ weight.T (+ bias)`` by oneDNN's inner product (``weight``: (n, k)
    row-major). The primitive returns a new tensor; copying it into the device buffer
    costs ~10 us for 512 KiB, less than what the primitive saves on the products it is
    chosen for."""
    out.copy_(_ONEDNN_LINEAR(lhs, weight, bias, "none", [], ""))


class ResidentWeightLinear:
    """The launch of ``out = lhs @ weight.T`` by oneDNN's inner product where ``weight``
    ((n, k) row-major, device memory) holds a resident input no step writes (``operand``:
    its :class:`~simaccel.runtime.resident.ResidentOperand`).

    Once the weight's device copy has kept its contents for :data:`REORDER_AFTER`
    launches, the weight is reordered into oneDNN's blocked layout (for this launch's
    batch; the primitive takes it at any batch), kept in device memory the program
    reserves, and the product reads that copy (the same bits out). The step's launches
    at other size tuples read the same copy. An upload of new contents makes it stale:
    it is dropped, its memory given back, and the count starts again. A device without
    room for it keeps the plain weight."""

    __slots__ = ("lhs", "weight", "out", "operand", "key", "runs")

    def __init__(self, lhs: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
                 operand: Any) -> None:
        self.lhs, self.weight, self.out, self.operand = lhs, weight, out, operand
        self.key: Any = None
        self.runs = 0

    def __call__(self) -> None:
        _inner_product(self.lhs, self._weight(), self.out)

    def repoint(self, position: int, tensor: torch.Tensor) -> None:
        """The same product into another ``out`` (``position`` 0) or on another ``lhs``
        (1), as :meth:`GemmLaunch.patch` asks."""
        if position == 0:
            self.out = tensor
        else:
            self.lhs = tensor

    def _weight(self) -> torch.Tensor:
        """The reordered copy if one is kept for the weight's contents now, else the
        weight (reordered first if it has stayed unchanged long enough)."""
        key = self.operand.content()
        if key is None:
            return self.weight
        if key != self.key:  # new contents: the count starts (a stale copy is dropped)
            self.key, self.runs = key, 0
            self.operand.form(key)
            return self.weight
        form = self.operand.form(key)
        if form is not None or self.runs >= REORDER_AFTER:
            return self.weight if form is None else form
        self.runs += 1
        if self.runs == REORDER_AFTER:
            form = _ONEDNN_REORDER(self.weight, self.lhs.shape[0])
            nbytes = self.weight.numel() * self.weight.element_size()
            if self.operand.keep(key, form, nbytes):
                return form
        return self.weight


def _nothing() -> None:
    """An empty GEMM's launch."""


gemm = Gemm()
gemm_bfloat16 = Gemm(torch.bfloat16)
gemm_bias = GemmBias()
gemm_bias_bfloat16 = GemmBias(torch.bfloat16)


def gemm_for(dtype: str, bias: bool = False) -> Gemm:
    """The library GEMM of operands of ``dtype`` (one of :data:`GEMM_DTYPES`); ``bias``:
    with a bias epilogue (2-D only)."""
    if dtype != "bfloat16":
        return gemm_bias if bias else gemm
    return gemm_bias_bfloat16 if bias else gemm_bfloat16

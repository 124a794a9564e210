"""Vendor-library calls on device buffers beyond GEMM: linear algebra (a cuSOLVER/LAPACK
routine), FFT (cuFFT) and complex arithmetic. As :mod:`.library` does for GEMM, the
library is PyTorch's own CPU kernels run on tensors that *view* device memory, so nothing
crosses the bus and nothing is compiled: what inductor does with ops it has no lowering
for (an extern ATen call on the device's buffers). The call is a device kernel launch
(:class:`~simaccel.codegen.ir.LibraryKernel`); it does not fuse.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten


@dataclass(frozen=True)
class TensorSpec:
    """How one operand or result lives in its flat device buffer (elements)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    dtype: torch.dtype

    def view(self, array: np.ndarray) -> torch.Tensor:
        base = torch.from_numpy(array)
        if base.dtype != self.dtype:  # raw bits of a dtype numpy lacks (bfloat16, ...)
            base = base.view(self.dtype)
        return base.as_strided(self.shape, self.strides, self.offset)


class LibraryCall:
    """``call(*arrays)``: the op on tensors viewing the input arrays (in the order of the
    tensor leaves of its arguments), results copied into the output arrays."""

    def __init__(self, op: Any, args: tuple, kwargs: dict, inputs: list[TensorSpec],
                 outputs: list[TensorSpec | None], kind: str):
        self.op = op
        self._leaves, self._spec = tree_flatten((args, kwargs))
        self._slots = [k for k, leaf in enumerate(self._leaves) if leaf is _TENSOR]
        self.inputs = inputs
        self.outputs = outputs
        self.__qualname__ = f"{kind}.{getattr(op, '__name__', op)}"

    def __call__(self, *arrays: np.ndarray) -> None:
        self.bind(*arrays)()

    def bind(self, *arrays: np.ndarray, addresses: Any = None) -> Callable[[], None]:
        """The call on these arrays as a zero-argument launch: the tensors viewing them
        and the op's arguments are made once (a program binds per workspace and size
        tuple), so a launch is the op and its result copies. ``addresses``: unused."""
        leaves = list(self._leaves)
        for slot, spec, array in zip(self._slots, self.inputs, arrays):
            leaves[slot] = spec.view(array)
        args, kwargs = tree_unflatten(leaves, self._spec)
        out_arrays = iter(arrays[len(self.inputs):])
        #: per result: the tensor viewing its output array, or None (not a tensor)
        outs = [None if spec is None else spec.view(next(out_arrays)) for spec in self.outputs]
        op = self.op

        def launch() -> None:
            result = op(*args, **kwargs)
            results = result if isinstance(result, (list, tuple)) else (result,)
            for out, value in zip(outs, results):
                if out is not None:
                    out.copy_(value)
        return launch


class _TensorSlot:
    """Marks where a tensor operand goes in a call's arguments."""

    def __repr__(self) -> str:
        return "<tensor>"


_TENSOR = _TensorSlot()


def tensor_slot() -> _TensorSlot:
    return _TENSOR

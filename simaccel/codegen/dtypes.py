"""The one dtype table: which dtypes the device computes in, which it only stores, and
how each is named in device memory (numpy) and on the torch side.

Names are numpy dtype names (``"float32"``); a dtype numpy lacks is stored as raw bytes
of a same-width integer (``bfloat16`` as ``int16``).
"""
from __future__ import annotations

import torch

#: dtypes the device computes in, by numpy name. The 16-bit floats are stored as such
#: (half the bytes to move and to keep) and computed in float32: a kernel loads them as
#: float32 and rounds once, when it stores (see :mod:`simaccel.codegen.half_lib`).
DEVICE_DTYPES = ("float32", "float64", "int32", "int64", "bool", "int8", "uint8", "int16",
                 "float16", "bfloat16")
HALF_DTYPES = ("float16", "bfloat16")
FLOAT_DTYPES = ("float32", "float64") + HALF_DTYPES
#: dtypes the device stores and moves but does not compute in (their ops run on the host).
STORAGE_ONLY_DTYPES = ("complex64", "complex128", "complex32", "uint16", "uint32", "uint64")
#: storage dtype of tensors numpy (or numba) has no dtype for: their raw bits, as a
#: same-width integer.
STORAGE_DTYPES = {"bfloat16": "int16", "float16": "int16", "complex32": "int32",
                  "uint16": "int16", "uint32": "int32", "uint64": "int64"}

#: torch dtypes whose CPU tensors ``.numpy()`` takes directly into a buffer of their
#: storage dtype (the others need :func:`byte_view`).
NUMPY_TORCH_DTYPES = frozenset({
    torch.float32, torch.float64, torch.int32, torch.int64, torch.bool, torch.int8,
    torch.uint8, torch.int16, torch.complex64, torch.complex128})
#: of those, the ones whose tensors are never conjugate or negative views (no resolve
#: needed before ``.numpy()``): the per-call fast path.
PLAIN_TORCH_DTYPES = NUMPY_TORCH_DTYPES - {torch.complex64, torch.complex128}
#: dtypes of 0-d inputs the constant bank takes as Python numbers (``item()`` is exact).
BANK_TORCH_DTYPES = frozenset({torch.float64, torch.float32, torch.int64, torch.int32,
                               torch.bool})


def is_float(dtype: str) -> bool:
    """True for the floating dtypes the device computes in."""
    return dtype in FLOAT_DTYPES


def compute_dtype(dtype: str) -> str:
    """The dtype kernels compute a ``dtype`` value in: float32 for the 16-bit floats."""
    return "float32" if dtype in HALF_DTYPES else dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).replace("torch.", "")


def torch_to_np_dtype(dtype: torch.dtype) -> str | None:
    """The device compute dtype name of ``dtype``, or None."""
    name = dtype_name(dtype)
    return name if name in DEVICE_DTYPES else None


def storage_name(dtype: torch.dtype) -> str | None:
    """The name a tensor of ``dtype`` is stored under in device memory, or None."""
    name = dtype_name(dtype)
    return name if name in DEVICE_DTYPES or name in STORAGE_ONLY_DTYPES else None


def storage_dtype(dtype: str) -> str:
    """The numpy dtype that holds a ``dtype`` buffer's bytes."""
    return STORAGE_DTYPES.get(dtype, dtype)


#: the torch dtype viewing each :data:`STORAGE_DTYPES` dtype's bits (keyed by torch
#: dtype: a dict lookup, where naming the dtype costs ~1 us per tensor and call)
TORCH_STORAGE_VIEWS = {getattr(torch, name): getattr(torch, storage)
                       for name, storage in STORAGE_DTYPES.items() if hasattr(torch, name)}
#: the real 16-bit float dtypes, never conjugate or negative views: the per-call fast path
#: takes ``.numpy()`` of their :func:`byte_view`
PLAIN_HALF_TORCH_DTYPES = frozenset({torch.bfloat16, torch.float16})


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as its storage dtype (a bfloat16 tensor as int16), for ``.numpy()``."""
    view = TORCH_STORAGE_VIEWS.get(t.dtype)
    return t.view(view) if view is not None else t

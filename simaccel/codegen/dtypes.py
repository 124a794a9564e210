"""The one dtype table: which dtypes the device computes in, which it only stores, and
how each is named in device memory (numpy) and on the torch side.

Names are numpy dtype names (``"float32"``); a dtype numpy lacks is stored as raw bytes
of a same-width integer (``bfloat16`` as ``int16``).
"""
from __future__ import annotations

import torch

#: dtypes the device computes in, by numpy name.
DEVICE_DTYPES = ("float32", "float64", "int32", "int64", "bool", "int8", "uint8", "int16")
FLOAT_DTYPES = ("float32", "float64")
#: dtypes the device stores and moves but does not compute in (their ops run on the host).
STORAGE_ONLY_DTYPES = ("float16", "bfloat16", "complex64", "complex128")
#: storage dtype of tensors numpy has no dtype for (moved as raw bytes).
STORAGE_DTYPES = {"bfloat16": "int16"}

#: torch dtypes whose CPU tensors ``.numpy()`` takes directly (bfloat16 needs a view).
NUMPY_TORCH_DTYPES = frozenset({
    torch.float32, torch.float64, torch.int32, torch.int64, torch.bool, torch.int8,
    torch.uint8, torch.int16, torch.float16, torch.complex64, torch.complex128})
#: of those, the ones whose tensors are never conjugate or negative views (no resolve
#: needed before ``.numpy()``): the per-call fast path.
PLAIN_TORCH_DTYPES = NUMPY_TORCH_DTYPES - {torch.complex64, torch.complex128}
#: dtypes of 0-d inputs the constant bank takes as Python numbers (``item()`` is exact).
BANK_TORCH_DTYPES = frozenset({torch.float64, torch.float32, torch.int64, torch.int32,
                               torch.bool})


def is_float(dtype: str) -> bool:
    """True for the floating dtypes the device computes in."""
    return dtype in FLOAT_DTYPES


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


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as its storage dtype (a bfloat16 tensor as int16), for ``.numpy()``."""
    return t.view(torch.int16) if dtype_name(t.dtype) in STORAGE_DTYPES else t

"""Kernel helpers beyond :mod:`.kernel_lib`'s core, re-exported by it so kernels name
them ``lib.<name>``: 16-bit float loads and stores (:mod:`.half_lib`) and the special
functions (``lib.special``, ``lib.special_bessel``, ``lib.special_modified``,
``lib.special_poly``), the index bound checks (:mod:`.index_lib`) and the error they
raise (``lib.KernelIndexError``)."""
from __future__ import annotations

from simaccel.codegen import special_bessel, special_modified, special_poly
from simaccel.codegen import special_lib as special
from simaccel.codegen.half_lib import bf16_load, bf16_store, f16_load, f16_store
from simaccel.codegen.index_lib import clamped_index, index_outside
from simaccel.errors import KernelIndexError

__all__ = ["KernelIndexError", "bf16_load", "bf16_store", "clamped_index", "f16_load",
           "f16_store", "index_outside", "special", "special_bessel", "special_modified",
           "special_poly"]

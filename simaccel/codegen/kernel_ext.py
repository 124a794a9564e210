"""Kernel helpers beyond :mod:`.kernel_lib`'s core, re-exported by it so kernels name
them ``lib.<name>``: 16-bit float loads and stores (:mod:`.half_lib`) and the special
functions (``lib.special``, ``lib.special_bessel``, ``lib.special_modified``,
``lib.special_poly``)."""
from __future__ import annotations

from simaccel.codegen import special_bessel, special_modified, special_poly
from simaccel.codegen import special_lib as special
from simaccel.codegen.half_lib import bf16_load, bf16_store, f16_load, f16_store

__all__ = ["bf16_load", "bf16_store", "f16_load", "f16_store", "special", "special_bessel",
           "special_modified", "special_poly"]

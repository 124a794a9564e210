"""Codegen: ATen graph -> kernel IR -> fused kernels (Python source) -> numba.

Importing the package registers every lowering (:mod:`simaccel.codegen.registry`), in
this order: pointwise and scalar ops first, then views, indexing, reductions and
templates (a later module may override an overload an earlier op packet registered).
"""
from simaccel.codegen import lowering, lower_views, lower_index, lower_reduce, lower_extern  # noqa: F401

"""Codegen: ATen graph -> kernel IR -> fused kernels (Python source) -> numba.

Importing the package registers every lowering (:mod:`simaccel.codegen.registry`), in
this order: pointwise and scalar ops first, then views, indexing, reductions and
templates (a later module may override an overload an earlier op packet registered).
"""
from simaccel.codegen import lowering, lower_views, lower_index, lower_reduce, lower_extern  # noqa: F401
from simaccel.codegen import lower_scalar_args  # noqa: F401,E402  (after lowering: overrides pow.Tensor_Scalar)
from simaccel.codegen import lower_foreach  # noqa: F401,E402
# op coverage (issue 14): copies, sorting, scatters, scans, special functions, convolution,
# pooling, resampling, library calls (linear algebra, FFT)
from simaccel.codegen import lower_copy  # noqa: F401,E402
from simaccel.codegen import lower_sort  # noqa: F401,E402
from simaccel.codegen import lower_scatter  # noqa: F401,E402
from simaccel.codegen import lower_scan, lower_nonzero, lower_asserts  # noqa: F401,E402
from simaccel.codegen import lower_special  # noqa: F401,E402
from simaccel.codegen import lower_conv, lower_pool, lower_products  # noqa: F401,E402
from simaccel.codegen import lower_library  # noqa: F401,E402  (last: wraps earlier lowerings for complex tensors)
from simaccel.codegen import lower_attention  # noqa: F401,E402
from simaccel.codegen import lower_random  # noqa: F401,E402

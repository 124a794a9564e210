"""Library kernels bound to device buffers once (simaccel.codegen.library, .library_calls):
a bound launch reads the buffers' contents at each launch, not at bind time, and equals
the unbound call."""
from __future__ import annotations

import numpy as np
import torch

from simaccel.codegen import library
from simaccel.codegen.blas_launch import BlasGemmLaunch
from simaccel.codegen.library_calls import LibraryCall, TensorSpec, tensor_slot

#: float32 GEMM against torch.mm on the same operands: the same BLAS, so only the
#: summation order of a transposed operand can differ
TOL = dict(rtol=1e-5, atol=1e-5)


def _flat(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().numpy().reshape(-1).copy()


def test_a_bound_gemm_reads_its_buffers_at_each_launch() -> None:
    m, k, n = 5, 7, 3
    a, b = torch.randn(m, k), torch.randn(n, k)  # b transposed: column-major (k, n)
    a_buf, b_buf, out = _flat(a), _flat(b), np.full(m * n + 4, np.nan, np.float32)
    launch = library.gemm.bind(out, a_buf, b_buf, 1, m, k, n, 0, 0, 0, 0, 0, 1)
    launch()
    torch.testing.assert_close(torch.from_numpy(out[:m * n]).view(m, n), a @ b.t(), **TOL)
    a2 = torch.randn(m, k)
    a_buf[:] = _flat(a2)  # the device buffer changes in place: the bound views see it
    launch()
    torch.testing.assert_close(torch.from_numpy(out[:m * n]).view(m, n), a2 @ b.t(), **TOL)
    assert np.isnan(out[m * n:]).all()  # nothing past the result is written


def test_bound_and_unbound_batched_gemm_agree() -> None:
    batch, m, k, n = 3, 4, 6, 5
    a, b = torch.randn(batch, m, k), torch.randn(batch, k, n)
    args = (batch, m, k, n, 0, m * k, 0, k * n, 0, 0)
    bound_out, called_out = np.zeros(batch * m * n, np.float32), np.zeros(batch * m * n,
                                                                       np.float32)
    library.gemm.bind(bound_out, _flat(a), _flat(b), *args)()
    library.gemm(called_out, _flat(a), _flat(b), *args)
    np.testing.assert_array_equal(bound_out, called_out)
    torch.testing.assert_close(torch.from_numpy(bound_out).view(batch, m, n), a @ b, **TOL)


def test_an_empty_inner_dimension_zeroes_the_result() -> None:
    out = np.full(6, 7.0, np.float32)
    library.gemm.bind(out, np.zeros(0, np.float32), np.zeros(0, np.float32),
                      1, 2, 0, 3, 0, 0, 0, 0, 0, 0)()
    assert (out == 0).all()


def test_a_bound_library_call_reads_its_buffers_at_each_launch() -> None:
    spec = TensorSpec((2, 3), (3, 1), 0, torch.float32)
    call = LibraryCall(torch.ops.aten.cumsum.default, (tensor_slot(), 1), {}, [spec], [spec],
                       "test")
    x, out = np.arange(6, dtype=np.float32), np.zeros(6, np.float32)
    launch = call.bind(x, out)
    launch()
    np.testing.assert_array_equal(out, np.cumsum(x.reshape(2, 3), axis=1).reshape(-1))
    x[:] = 1.0
    launch()
    np.testing.assert_array_equal(out, [1, 2, 3, 1, 2, 3])


#: oneDNN's inner product against torch.mm (MKL): different kernels block the k-sum
#: differently; sums of 512 products of unit normals (~22 in magnitude), float32
INNER_PRODUCT_TOL = dict(rtol=1e-5, atol=1e-4)


def test_a_large_linear_gemm_runs_as_the_inner_product_and_reads_its_buffers() -> None:
    m, k, n = 64, 512, 1024  # m * k * n = 2 ** 25 >= ONEDNN_PLAIN_MIN_MACS
    assert m * k * n >= library.ONEDNN_PLAIN_MIN_MACS
    a, w = torch.randn(m, k), torch.randn(n, k)  # w: a linear weight, b = w.T
    a_buf, w_buf, out = _flat(a), _flat(w), np.full(m * n + 4, np.nan, np.float32)
    launch = library.gemm.bind(out, a_buf, w_buf, 1, m, k, n, 0, 0, 0, 0, 0, 1)
    assert launch.call.func is library._inner_product
    launch()
    torch.testing.assert_close(torch.from_numpy(out[:m * n]).view(m, n), a @ w.t(),
                               **INNER_PRODUCT_TOL)
    w2 = torch.randn(n, k)
    w_buf[:] = _flat(w2)  # the weight's device buffer changes: the next launch reads it
    launch()
    torch.testing.assert_close(torch.from_numpy(out[:m * n]).view(m, n), a @ w2.t(),
                               **INNER_PRODUCT_TOL)
    assert np.isnan(out[m * n:]).all()


def test_small_or_untransposed_gemms_stay_on_the_blas_call() -> None:
    m, k, n = 64, 512, 1024
    a_buf, b_buf = _flat(torch.randn(m, k)), _flat(torch.randn(k, n))
    out = np.zeros(m * n, np.float32)
    row_major_b = library.gemm.bind(out, a_buf, b_buf, 1, m, k, n, 0, 0, 0, 0, 0, 0)
    small = library.gemm.bind(out[:8 * 16], a_buf, b_buf, 1, 8, 16, 16, 0, 0, 0, 0, 0, 1)
    as_f64 = library.gemm.bind(np.zeros(m * n), a_buf.astype(np.float64),
                               b_buf.astype(np.float64), 1, m, k, n, 0, 0, 0, 0, 0, 1)
    # MKL's GEMM (torch.mm's) on the buffers' addresses
    assert all(isinstance(launch, BlasGemmLaunch) for launch in (row_major_b, small, as_f64))


def _patched_into_a_new_output(launch, out: np.ndarray) -> np.ndarray:
    """Patch ``launch``'s output to a fresh NaN array the size of ``out`` and launch it:
    the new array, after checking the old one kept what it had."""
    before = out.copy()
    new = np.full_like(out, np.nan)
    launch.patch(0, new, new.ctypes.data)
    launch()
    np.testing.assert_array_equal(out, before)  # the old output is left alone
    return new


def test_a_patched_gemm_writes_its_new_output_and_reads_its_new_operand() -> None:
    """A host-mapped output is a new array every call: the launch is re-pointed at it
    (GemmLaunch.patch), as each library path takes it: MKL's GEMM, oneDNN's inner
    product, the bias epilogue."""
    m, k, n = 64, 512, 1024
    a, w, bias = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    for name, cols in (("mm", 16), ("inner product", n), ("bias", 16)):
        w_buf, row = _flat(w[:cols]), bias[:cols] if name == "bias" else 0

        def expected(lhs: torch.Tensor) -> torch.Tensor:
            return lhs @ w[:cols].t() + row
        out = np.zeros(m * cols, np.float32)
        args = (1, m, k, cols, 0, 0, 0, 0, 0, 1)
        launch = library.gemm_bias.bind(out, _flat(a), w_buf, _flat(bias), *args) \
            if name == "bias" else library.gemm.bind(out, _flat(a), w_buf, *args)
        launch()
        tol = INNER_PRODUCT_TOL if name == "inner product" else TOL
        new = _patched_into_a_new_output(launch, out)
        torch.testing.assert_close(torch.from_numpy(new).view(m, cols), expected(a), **tol)
        a2 = torch.randn(m, k)
        lhs = _flat(a2)
        launch.patch(1, lhs, lhs.ctypes.data)
        launch()
        torch.testing.assert_close(torch.from_numpy(new).view(m, cols), expected(a2), **tol)


class _UnchangedOperand:
    """A resident operand whose contents never change (key 1), keeping what it is given
    (:class:`~simaccel.runtime.resident.ResidentOperand`'s interface)."""

    kept = None

    def content(self):
        return 1

    def form(self, key):
        return self.kept

    def keep(self, key, form, nbytes):
        self.kept = form
        return True


def test_a_mid_sized_product_is_the_inner_product_only_on_a_resident_weight() -> None:
    """At 2 ** 24 multiply-adds (m64 k512 n512) oneDNN wins on a reordered resident weight
    but not on a weight it reads as stored (a trained layer's: MKL's ``mm``)."""
    m, k, n = 64, 512, 512
    assert library.ONEDNN_MIN_MACS <= m * k * n < library.ONEDNN_PLAIN_MIN_MACS
    a, w = torch.randn(m, k), torch.randn(n, k)
    out = np.zeros(m * n, np.float32)
    plain = library.gemm.bind(out, _flat(a), _flat(w), 1, m, k, n, 0, 0, 0, 0, 0, 1)
    assert isinstance(plain, BlasGemmLaunch)  # MKL's GEMM, as torch.mm runs it
    resident = library.gemm.bind(out, _flat(a), _flat(w), 1, m, k, n, 0, 0, 0, 0, 0, 1,
                                 operands=[None, None, _UnchangedOperand()])
    assert isinstance(resident.call, library.ResidentWeightLinear)
    for launch in (plain, resident):
        out[:] = np.nan
        launch()
        torch.testing.assert_close(torch.from_numpy(out).view(m, n), a @ w.t(),
                                   **INNER_PRODUCT_TOL)


def test_a_patched_resident_weight_product_keeps_its_reordered_weight() -> None:
    """A resident weight's product re-pointed at a new output keeps the reordered copy it
    made (an inference model's large output, host-mapped, is new every call)."""
    m, k, n = 64, 512, 1024
    a, w = torch.randn(m, k), torch.randn(n, k)
    operand = _UnchangedOperand()
    out = np.zeros(m * n, np.float32)
    launch = library.gemm.bind(out, _flat(a), _flat(w), 1, m, k, n, 0, 0, 0, 0, 0, 1,
                               operands=[None, None, operand])
    product = launch.call
    for _ in range(library.REORDER_AFTER + 1):
        launch()
    assert operand.kept is not None
    new = _patched_into_a_new_output(launch, out)
    assert launch.call is product  # the same launch, still reading the reordered copy
    torch.testing.assert_close(torch.from_numpy(new).view(m, n), a @ w.t(),
                               **INNER_PRODUCT_TOL)

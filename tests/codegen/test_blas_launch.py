"""2-D library GEMMs launched by the BLAS routine on buffer addresses: every operand
layout and offset equal to numpy's product, and a patch re-points one address."""
from __future__ import annotations

import numpy as np
import pytest

from simaccel.codegen import library
from simaccel.codegen.blas_launch import BlasGemmLaunch, blas_launch

#: float32 sums of 40 products of unit normals; float64 far tighter
TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def _operand(rng, rows: int, cols: int, transposed: bool, offset: int, dtype) -> tuple:
    """(the matrix, a flat buffer holding it from element ``offset``, row-major or
    column-major), the rest of the buffer NaN."""
    matrix = rng.standard_normal((rows, cols)).astype(dtype)
    stored = matrix.T if transposed else matrix
    buf = np.full(offset + rows * cols + 3, np.nan, dtype)
    buf[offset:offset + rows * cols] = stored.reshape(-1)
    return matrix, buf


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("a_t,b_t", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_every_layout_and_offset_is_the_product_and_a_patch_repoints_it(dtype, a_t, b_t):
    rng = np.random.default_rng(a_t * 2 + b_t)
    m, k, n, a_off, b_off = 7, 40, 9, 5, 11
    a, a_buf = _operand(rng, m, k, a_t, a_off, dtype)
    b, b_buf = _operand(rng, k, n, b_t, b_off, dtype)
    out = np.full(m * n, np.nan, dtype)
    launch = library.gemm.bind(out, a_buf, b_buf, 1, m, k, n, a_off, 0, b_off, 0, a_t, b_t)
    assert isinstance(launch, BlasGemmLaunch)
    launch()
    np.testing.assert_allclose(out.reshape(m, n), a @ b, **TOL[dtype])
    a2, a2_buf = _operand(rng, m, k, a_t, a_off, dtype)  # a new operand, same offset
    new_out = np.full_like(out, np.nan)
    before = out.copy()
    launch.patch(1, a2_buf, a2_buf.ctypes.data)
    launch.patch(0, new_out, new_out.ctypes.data)
    launch()
    np.testing.assert_allclose(new_out.reshape(m, n), a2 @ b, **TOL[dtype])
    np.testing.assert_array_equal(out, before)  # the old output is left alone
    assert np.isnan(a_buf[:a_off]).all() and np.isnan(b_buf[:b_off]).all()


def test_batched_empty_or_mixed_products_are_not_one_blas_call():
    f32, f64 = np.zeros(64, np.float32), np.zeros(64, np.float64)
    assert blas_launch((2, 2, 2, 2, 0, 4, 0, 4, 0, 0), (f32, f32, f32)) is None  # batched
    assert blas_launch((1, 2, 0, 2, 0, 0, 0, 0, 0, 0), (f32, f32, f32)) is None  # k = 0
    assert blas_launch((1, 2, 2, 2, 0, 0, 0, 0, 0, 0), (f32, f64, f32)) is None  # mixed
    ints = np.zeros(64, np.int64)
    assert blas_launch((1, 2, 2, 2, 0, 0, 0, 0, 0, 0), (ints, ints, ints)) is None
    assert isinstance(blas_launch((1, 2, 2, 2, 0, 0, 0, 0, 0, 0), (f64, f64, f64)),
                      BlasGemmLaunch)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_product_with_a_bias_row_is_addmm_and_a_patch_repoints_each_buffer(dtype):
    """``out = bias + a @ b`` (a linear layer whose result several kernels read):
    torch.addmm's result, and after patching the output and the bias to new arrays."""
    import torch
    rng = np.random.default_rng(7)
    m, k, n = 6, 40, 9
    a, a_buf = _operand(rng, m, k, False, 3, dtype)
    w, w_buf = _operand(rng, n, k, False, 0, dtype)  # b = w.T: column-major
    bias = rng.standard_normal(n).astype(dtype)
    out = np.full(m * n, np.nan, dtype)
    launch = library.gemm_bias.bind(out, a_buf, w_buf, bias, 1, m, k, n, 3, 0, 0, 0, 0, 1)
    assert isinstance(launch, BlasGemmLaunch)

    def addmm(row: np.ndarray) -> np.ndarray:
        return torch.addmm(torch.from_numpy(row), torch.from_numpy(a),
                           torch.from_numpy(w).t()).numpy()
    for _ in range(2):  # the bias is copied in again at every launch
        launch()
        np.testing.assert_allclose(out.reshape(m, n), addmm(bias), **TOL[dtype])
    new_out, new_bias = np.full_like(out, np.nan), bias * 3
    launch.patch(0, new_out, new_out.ctypes.data)
    launch.patch(3, new_bias, new_bias.ctypes.data)
    before = out.copy()
    launch()
    np.testing.assert_allclose(new_out.reshape(m, n), addmm(new_bias), **TOL[dtype])
    np.testing.assert_array_equal(out, before)

"""Native command lists (simaccel.codegen.commands): one machine-code call runs a recorded
sequence of entries (simaccel native kernels, numba entries, BLAS routines, a bias row
copy), reading each argument from its ctypes object at every launch, so a patched pointer
is followed without building the list again; a raising entry stops the list and names
itself. Results are compared with torch and the kernels' plain calls."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from simaccel.codegen import commands
from simaccel.codegen.blas_launch import BlasGemmBiasLaunch, blas_launch
from simaccel.codegen.cache import KernelCache
from simaccel.errors import KernelIndexError
from tests.codegen.test_native import SIG, SOURCE, _expected
from tests.codegen.test_numba_entry import PARALLEL


def test_the_ir_reads_every_argument_from_its_ctypes_object():
    pointer, count = ctypes.c_void_p(64), ctypes.c_int64(7)
    numba_pointer, numba_count = ctypes.c_void_p(128), ctypes.c_int64(9)
    ir = commands.command_list_ir([(4096, (pointer, count)),
                                   (8192, (numba_pointer, numba_count, ctypes.c_int64(3)))],
                                  failed_at=512)
    assert ir.startswith("define i32 @sk_commands()")
    assert f"%a0 = inttoptr i64 {ctypes.addressof(pointer)} to ptr" in ir
    assert f"%a1 = inttoptr i64 {ctypes.addressof(count)} to ptr" in ir
    assert "call i32 %f0(ptr %p0, i64 %v1)" in ir  # an entry's own ABI
    assert "call i32 %f1(ptr %p2, i64 %v3, i64 %v4)" in ir
    assert "%at1 = inttoptr i64 512 to ptr" in ir and "store i64 1, ptr %at1" in ir
    assert ir.count("ret i32 %r") == 2


def test_a_numba_entry_spells_out_numba_convention(tmp_path):
    """A numba-entry launch's command-list entry: its return and exception slots, then
    per array meminfo and parent (null), length, item size, data, shape and stride,
    then the ints; the data pointers are the ones a patch stores into."""
    fn = KernelCache(tmp_path).load(PARALLEL, SIG).fn
    a = np.linspace(-2, 2, 9, dtype=np.float32)
    out = np.zeros_like(a)
    launch = fn.bind(out, a, 9)
    ((address, c_args),) = launch.commands
    assert len(c_args) == 2 + 7 * 2 + 1
    values = [arg.value for arg in c_args]
    assert values[2:9] == [None, None, 9, 4, out.ctypes.data, 9, 4]
    assert values[9:16] == [None, None, 9, 4, a.ctypes.data, 9, 4] and values[16] == 9
    assert [c_args[s].value for s in fn.array_slots(2)] == [out.ctypes.data, a.ctypes.data]
    new_out = np.zeros_like(a)
    launch.patch(0, new_out, new_out.ctypes.data)
    assert c_args[fn.array_slots(1)[0]].value == new_out.ctypes.data


def test_the_ir_of_a_blas_call_and_a_row_copy():
    values = [ctypes.c_void_p(16), ctypes.c_void_p(32), ctypes.c_int64(4), ctypes.c_int64(8)]
    ir = commands.command_list_ir([(0, tuple(values), commands.ROWS),
                                   (4096, tuple(values[:2]), commands.VOID)], failed_at=8)
    assert "call void @llvm.memcpy.p0.p0.i64(ptr %to0, ptr %p1, i64 %v3, i1 false)" in ir
    assert "%i0 = phi i64 [0, %entry], [%next0, %row0]" in ir
    assert "call void %f1(ptr %p4, ptr %p5)" in ir  # a BLAS routine: addresses, no status
    assert "ret i32 %r" not in ir  # neither can fail


def _bias_gemm(dtype: np.dtype, m: int = 5, k: int = 7, n: int = 3):
    """A bias GEMM launch on fresh arrays: (launch, out, a, b, bias)."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    out, bias = np.zeros(m * n, dtype), rng.standard_normal(n).astype(dtype)
    launch = blas_launch((1, m, k, n, 0, 0, 0, 0, 0, 0), (out, a.reshape(-1), b.reshape(-1),
                                                          bias))
    assert isinstance(launch, BlasGemmBiasLaunch)
    return launch, out, a, b, bias


def _addmm(bias: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return torch.addmm(torch.from_numpy(bias), torch.from_numpy(a), torch.from_numpy(b)).numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_bias_gemm_as_a_command_list_equals_addmm_and_follows_patches(dtype):
    """The bias row copied into the output's rows, then the product added, from one
    native call; re-pointed at a new output and bias by patches (a training step's
    new arrays), the same list computes into the new output and leaves the old alone."""
    launch, out, a, b, bias = _bias_gemm(np.dtype(dtype))
    listed = commands.command_list(launch.commands)
    listed()
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out.reshape(a.shape[0], -1), _addmm(bias, a, b), rtol=tol,
                               atol=tol)
    before = out.copy()
    new_out, new_bias = np.zeros_like(out), bias * 10
    launch.patch(0, new_out, new_out.ctypes.data)
    launch.patch(3, new_bias, new_bias.ctypes.data)
    listed()
    np.testing.assert_allclose(new_out.reshape(a.shape[0], -1), _addmm(new_bias, a, b),
                               rtol=tol, atol=tol)
    np.testing.assert_array_equal(out, before)
    launch()  # the Python launch agrees with the list
    np.testing.assert_array_equal(new_out.reshape(a.shape[0], -1),
                                  _addmm(new_bias, a, b).astype(dtype))


def test_a_raising_entry_stops_the_list_and_names_itself(tmp_path):
    """A native kernel, then a prange kernel that raises on its data: the list stops with
    the kernel error class after the first entry ran, and ``failed_entry`` says which
    one; on good data the same list runs both."""
    native_fn = KernelCache(tmp_path).load(SOURCE, SIG).fn
    parallel_fn = KernelCache(tmp_path).load(PARALLEL, SIG).fn
    a = np.linspace(-2, 2, 16, dtype=np.float32)
    first_out, second_out = np.zeros_like(a), np.zeros_like(a)
    first = native_fn.bind(first_out, a, a.size)
    second = parallel_fn.bind(second_out, a, a.size)
    listed = commands.command_list([*first.commands, *second.commands])
    a[0] = 200.0  # the prange kernel refuses a[0] > 100
    with pytest.raises(KernelIndexError):
        listed()
    assert listed.failed_entry() == 1 and first_out[0] == np.inf  # the first one ran
    a[0] = -2.0
    listed()
    np.testing.assert_allclose(first_out, _expected(a), rtol=1e-6)
    np.testing.assert_allclose(second_out, _expected(a), rtol=1e-6)

"""numba-only kernels (prange, numba's thread pool) launched through their machine code:
bound launches and command lists call numba's compiled function in its own convention,
with the dispatcher's results, and patched arguments are followed."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from simaccel.codegen import native, numba_entry
from simaccel.codegen.cache import KernelCache
from simaccel.errors import KernelIndexError
from simaccel.runtime import group as launch_group
from tests.codegen.test_native import (SIG, SOURCE, _chained, _expected, _two_part_group,
                                       check_patched_group)

#: ``out = exp(a) * 2 + 1`` over ``n`` elements in numba's thread pool; raises (after the
#: loop, as simaccel's index check does) when ``n`` is past the arrays or ``a[0] > 100``
PARALLEL = textwrap.dedent("""\
    import numba
    import numpy as np


    @numba.njit(cache=True, nogil=True, error_model='numpy', parallel=True)
    def kernel(out, a, n):
        m = min(n, a.size)
        for i in numba.prange(m):
            out[i] = np.exp(a[i]) * np.float32(2.0) + np.float32(1.0)
        if n > a.size or a[0] > np.float32(100.0):
            raise IndexError("n past the arrays, or a[0] > 100")
    """)


def test_a_parallel_kernel_runs_by_its_machine_code(tmp_path):
    """Compiled, and loaded from numba's cache by a later process: the kernel is a
    :class:`NumbaEntryKernel` (never exported: no native object on disk), and its bound
    launch computes what numba's dispatcher computes."""
    compiled = KernelCache(tmp_path).load(PARALLEL, SIG)
    again = KernelCache(tmp_path).load(PARALLEL, SIG)
    assert list(tmp_path.glob("*.native")) == []
    for loaded in (compiled, again):
        assert isinstance(loaded.fn, numba_entry.NumbaEntryKernel)
    a = np.linspace(-2, 2, 4099, dtype=np.float32)
    by_launch, by_dispatcher = np.zeros_like(a), np.zeros_like(a)
    again.fn.bind(by_launch, a, a.size)()
    again.fn(by_dispatcher, a, a.size)  # a plain call: numba's dispatcher
    np.testing.assert_array_equal(by_launch, by_dispatcher)
    np.testing.assert_allclose(by_launch, _expected(a), rtol=1e-6)


def test_a_raise_in_a_bound_launch_is_a_kernel_error_and_the_kernel_stays_usable(tmp_path):
    fn = KernelCache(tmp_path).load(PARALLEL, SIG).fn
    a = np.linspace(-2, 2, 64, dtype=np.float32)
    out = np.zeros_like(a)
    with pytest.raises(KernelIndexError):
        fn.bind(out, a, a.size + 1)()
    out[:] = 0
    fn.bind(out, a, a.size)()
    np.testing.assert_allclose(out, _expected(a), rtol=1e-6)


@pytest.mark.parametrize("record", [False, True])
def test_a_group_with_a_parallel_part_becomes_one_command_list(tmp_path, record):
    """A native kernel and a prange kernel in one group: after :data:`RECORD_AFTER`
    launches one native call runs both, in order; a patch to new arrays (a gradient at a
    new address every step), before or after that, is followed by both launch forms."""
    first = KernelCache(tmp_path).load(SOURCE.replace("2.0", "3.0"), SIG).fn
    second = KernelCache(tmp_path).load(PARALLEL, SIG).fn
    assert isinstance(first, native.NativeKernel)
    assert isinstance(second, numba_entry.NumbaEntryKernel)
    launch, a, out = _two_part_group(first, second)
    for _ in range(launch_group.RECORD_AFTER + 1 if record else 1):
        out[:] = 0
        launch()
    assert (launch.recorded is not None) is record
    np.testing.assert_array_equal(out, _chained(first, second, a))
    check_patched_group(launch, first, second, out)


def test_a_raise_in_a_command_list_stops_it_as_a_kernel_error(tmp_path):
    """The prange part raises inside the recorded list: the list stops with the kernel's
    error class, as a native part's does, after the parts before it ran; the next launch
    on good data runs."""
    fn = KernelCache(tmp_path).load(PARALLEL, SIG).fn
    launch, a, out = _two_part_group(fn, fn)
    for _ in range(launch_group.RECORD_AFTER):
        launch()
    assert launch.recorded is not None
    a[0] = 200.0  # the first part writes exp(200) = inf, which the second refuses
    with pytest.raises(KernelIndexError):
        launch()
    mid = launch.calls[0].arrays[0]
    assert mid[0] == np.inf  # the first part ran
    a[0] = -2.0
    launch()
    np.testing.assert_array_equal(out, _chained(fn, fn, a))


def test_kernels_holding_the_gil_or_of_another_abi_stay_on_the_dispatcher():
    import numba

    def body(out, a, n):
        for i in range(n):
            out[i] = a[i]
    holding = numba.njit(body)
    free = numba.njit(nogil=True)(body)
    a = np.ones(4, np.float32)
    for dispatcher in (holding, free):
        dispatcher(np.zeros_like(a), a, 4)
    sig = free.signatures[0]
    assert numba_entry.entry_kernel(holding, sig, SIG) is None
    assert numba_entry.entry_kernel(free, sig, ("int64", *SIG[:2])) is None  # ints first
    assert isinstance(numba_entry.entry_kernel(free, sig, SIG), numba_entry.NumbaEntryKernel)


@pytest.mark.parametrize("parallel", [False, True])
def test_a_bound_launch_patched_to_new_arrays_computes_into_them(tmp_path, parallel):
    """A native and a prange kernel's bound launch re-pointed at new arrays (a host-mapped
    output or input at a new address every call) by a patch: it writes and reads the new
    ones and leaves the old alone."""
    fn = KernelCache(tmp_path).load(PARALLEL if parallel else SOURCE, SIG).fn
    a = np.linspace(-2, 2, 9, dtype=np.float32)
    out = np.zeros_like(a)
    launch = fn.bind(out, a, 9)
    launch()
    new_a, new_out = np.linspace(0, 1, 9, dtype=np.float32), np.zeros_like(a)
    before = out.copy()
    launch.patch(0, new_out, new_out.ctypes.data)
    launch.patch(1, new_a, new_a.ctypes.data)
    launch()
    np.testing.assert_allclose(new_out, _expected(new_a), rtol=1e-6)
    np.testing.assert_array_equal(out, before)

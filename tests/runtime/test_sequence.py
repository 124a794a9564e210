"""A replay's launches joined into command lists (simaccel.runtime.sequence): launch by
launch until they ran RECORD_AFTER times, then each run of native launches as one list
and every other launch on its own, with the same results; a raise inside a list reports
how many launches returned before it. Kernels are simaccel native and numba-entry
kernels; results are compared with their plain calls."""
from __future__ import annotations

import functools
import textwrap

import numpy as np
import pytest

from simaccel.codegen.cache import KernelCache
from simaccel.errors import KernelIndexError
from simaccel.runtime.group import RECORD_AFTER
from simaccel.runtime.sequence import LaunchSequence
from tests.codegen.test_native import SIG

#: ``out = a * 2 + 1``: a native kernel
DOUBLE = textwrap.dedent("""\
    import numba
    import numpy as np


    @numba.njit(cache=True, error_model='numpy')
    def kernel(out, a, n):
        for i in range(n):
            out[i] = a[i] * np.float32(2.0) + np.float32(1.0)
    """)
#: the same in numba's thread pool (a numba entry), raising when ``a[0] > 100``
PARALLEL_DOUBLE = textwrap.dedent("""\
    import numba
    import numpy as np


    @numba.njit(cache=True, nogil=True, error_model='numpy', parallel=True)
    def kernel(out, a, n):
        for i in numba.prange(n):
            out[i] = a[i] * np.float32(2.0) + np.float32(1.0)
        if a[0] > np.float32(100.0):
            raise IndexError("a[0] > 100")
    """)


def _chain(tmp_path) -> tuple[list, list[np.ndarray]]:
    """Five launches, each ``out = in * 2 + 1`` on the last one's output: native, numba
    entry, a Python call (no commands), native, numba entry. (launches, the input and
    every output)."""
    native_fn = KernelCache(tmp_path).load(DOUBLE, SIG).fn
    parallel_fn = KernelCache(tmp_path).load(PARALLEL_DOUBLE, SIG).fn
    arrays = [np.linspace(1, 2, 32, dtype=np.float32)]
    arrays += [np.zeros_like(arrays[0]) for _ in range(5)]
    launches = []
    for k, fn in enumerate([native_fn, parallel_fn, None, native_fn, parallel_fn]):
        out, a = arrays[k + 1], arrays[k]
        launches.append(functools.partial(native_fn, out, a, a.size) if fn is None
                        else fn.bind(out, a, a.size))
    return launches, arrays


def _expected_chain(a: np.ndarray) -> list[np.ndarray]:
    outs = [a]
    for _ in range(5):
        outs.append(outs[-1] * np.float32(2.0) + np.float32(1.0))
    return outs


def test_runs_of_native_launches_become_command_lists_with_the_same_results(tmp_path):
    launches, arrays = _chain(tmp_path)
    sequence = LaunchSequence(launches)
    for _ in range(RECORD_AFTER):
        assert sequence.steps is None
        sequence()
    assert [count for _, count, _ in sequence.steps] == [2, 1, 2]
    assert sequence.steps[1][0] is launches[2]  # the Python launch on its own
    for out in arrays[1:]:
        out[:] = 0
    sequence()
    for got, want in zip(arrays[1:], _expected_chain(arrays[0])[1:]):
        np.testing.assert_allclose(got, want, rtol=0)


@pytest.mark.parametrize("recorded", [False, True])
def test_a_raise_reports_the_launches_that_returned_before_it(tmp_path, recorded):
    """The last launch (a numba entry, inside the second list once recorded) refuses its
    input: four launches returned, and the sequence runs again on good data."""
    launches, arrays = _chain(tmp_path)
    sequence = LaunchSequence(launches)
    for _ in range(RECORD_AFTER if recorded else 0):
        sequence()
    assert (sequence.steps is not None) is recorded
    arrays[0][:] = 10.0  # 21 passes the first check; 175 reaches the last kernel
    with pytest.raises(KernelIndexError):
        sequence()
    assert sequence.launched == 4
    arrays[0][:] = np.linspace(1, 2, 32, dtype=np.float32)
    sequence()
    np.testing.assert_allclose(arrays[-1], _expected_chain(arrays[0])[-1], rtol=0)

"""Out-of-range indices: a gather, embedding, ``index``, ``index_select`` or scatter whose
index tensor holds a value outside the dimension it indexes raises IndexError
(``simaccel.errors.KernelIndexError``) as eager does, instead of reading or writing
outside a device buffer (a crash before). Negative indices count from the end where eager
allows them (not for ``embedding``). After the error the device is usable: the next call
equals eager, nothing is left allocated, nothing ran on the host."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import simaccel
from simaccel.codegen import numpy_lib
from simaccel.errors import KernelIndexError


def _active_bytes() -> int:
    return simaccel.get_device().memory_stats()["active_bytes.all.current"]


def _raises_like_eager(fn, compiled, *args) -> None:
    with pytest.raises((IndexError, RuntimeError)):
        fn(*args)
    before = _active_bytes()
    with pytest.raises(KernelIndexError, match="out of range"):
        compiled(*args)
    assert _active_bytes() == before  # the failed call freed what it took


#: name -> (fn, good indices, bad index prefixes): negative indices count from the end
#: where eager allows them (``index``) and raise where it does not
CASES = {
    "embedding": (lambda w, i: torch.nn.functional.embedding(i, w) * 2.0,
                  [3, 0, 9], [[3, 10], [-1, 2]]),
    "index_select": (lambda w, i: torch.index_select(w, 0, i) + 1.0,
                     [3, 1, 9], [[10, 1], [-1]]),
    "index": (lambda w, i: w[i] - 1.0, [2, -2, 0], [[10], [-11, 0]]),
    "gather": (lambda w, i: torch.gather(w, 0, i.unsqueeze(1).expand(-1, 4)) * 3.0,
               [1, 3, 8], [[10], [-1]]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_out_of_range_index_raises_and_the_next_call_works(name):
    fn, good, bads = CASES[name]
    weight = torch.randn(10, 4)
    compiled = torch.compile(fn, backend="simaccel", dynamic=False)
    with torch.no_grad():
        index = torch.tensor(good)
        torch.testing.assert_close(compiled(weight, index), fn(weight, index), rtol=0, atol=0)
        for bad in bads:
            _raises_like_eager(fn, compiled, weight, torch.tensor(bad + good[len(bad):]))
            again = compiled(weight, index)
            assert again.shape == (3, 4) and again.dtype == torch.float32
            torch.testing.assert_close(again, fn(weight, index), rtol=0, atol=0)
    stats = simaccel.get_device().runtime_stats()
    assert stats["host_fallback_ops"] == 0 and stats["kernel_launches"] > 0


def test_a_scatter_with_an_out_of_range_index_raises():
    def scatter(x, i, v):
        return torch.zeros(8).scatter_add(0, i, v) + x

    compiled = torch.compile(scatter, backend="simaccel", dynamic=False)
    x, v = torch.randn(8), torch.randn(3)
    good = torch.tensor([1, 7, 1])
    torch.testing.assert_close(compiled(x, good, v), scatter(x, good, v))
    _raises_like_eager(scatter, compiled, x, torch.tensor([1, 8, 1]), v)
    torch.testing.assert_close(compiled(x, good, v), scatter(x, good, v))


def test_a_large_gather_checks_its_indices_and_stays_parallel():
    """4096 rows of 512: the kernel's loop is large enough for prange; its index check
    counts bad indices and raises after the loop (a raise inside would keep numba from
    parallelising it)."""
    table = torch.randn(5000, 512)
    fn = lambda i: torch.nn.functional.embedding(i, table) + 1.0  # noqa: E731
    compiled = torch.compile(fn, backend="simaccel", dynamic=False)
    index = torch.randint(0, 5000, (4096,))
    with torch.no_grad():
        torch.testing.assert_close(compiled(index), fn(index), rtol=0, atol=0)
        bad = index.clone()
        bad[100] = 5000
        _raises_like_eager(fn, compiled, bad)
        simaccel.wait_for_kernels()  # the compiled kernel, not its tier-0 form
        _raises_like_eager(fn, compiled, bad)
        torch.testing.assert_close(compiled(index), fn(index), rtol=0, atol=0)


def test_the_tier0_form_checks_whole_index_arrays():
    assert np.array_equal(numpy_lib.checked_index(np.array([0, 4, 2]), 5), [0, 4, 2])
    for bad in ([0, 5], [-1, 2]):
        with pytest.raises(KernelIndexError):
            numpy_lib.checked_index(np.array(bad), 5)
    assert numpy_lib.checked_index(np.array([], dtype=np.int64), 0).size == 0


#: ops that index with a tensor through the same checked index (their decompositions
#: gather or scatter): each raises on an out-of-range index as eager does
MORE = {
    "index_add": lambda i: torch.zeros(5).index_add(0, i, torch.ones(3)) * 2,
    "index_copy": lambda i: torch.zeros(5).index_copy(0, i, torch.ones(3)) * 2,
    "index_fill": lambda i: torch.zeros(5).index_fill(0, i, 1.0) * 2,
    "take": lambda i: torch.take(torch.arange(5.0), i) * 2,
    "take_along_dim": lambda i: torch.take_along_dim(torch.arange(5.0), i) * 2,
    "put": lambda i: torch.zeros(5).put(i, torch.ones(3)) * 2,
    "index_put": lambda i: torch.zeros(5).index_put((i,), torch.ones(3)) * 2,
}


@pytest.mark.parametrize("name", sorted(MORE))
def test_other_indexing_ops_raise_for_an_out_of_range_index(name):
    fn = MORE[name]
    compiled = torch.compile(fn, backend="simaccel", dynamic=False)
    good = torch.tensor([1, 4, 2])
    torch.testing.assert_close(compiled(good), fn(good), rtol=0, atol=0)
    _raises_like_eager(fn, compiled, torch.tensor([1, 9, 2]))
    torch.testing.assert_close(compiled(good), fn(good), rtol=0, atol=0)
    assert simaccel.get_device().runtime_stats()["host_fallback_ops"] == 0


def test_an_index_error_inside_a_recorded_command_list_places_what_ran():
    """A GEMM, then a gather by an index tensor, replayed until its launches run as one
    command list (:mod:`simaccel.runtime.sequence`): a bad index stops the list at the
    gather; the call raises as eager does, places the GEMM that ran and frees what it
    took, and the next call runs the list again and equals eager."""
    def fn(w: torch.Tensor, m: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return torch.index_select(w @ m, 0, i) + 1.0

    w, m, index = torch.randn(10, 16), torch.randn(16, 16), torch.tensor([3, 1, 9])
    compiled = torch.compile(fn, backend="simaccel", dynamic=False)
    device = simaccel.get_device()
    earlier = set(device.programs())  # other tests' programs, still alive
    with torch.no_grad():
        compiled(w, m, index)
        simaccel.wait_for_kernels()  # the compiled kernels, which lists call
        for _ in range(6):
            torch.testing.assert_close(compiled(w, m, index), fn(w, m, index))
        (program,) = [p for p in device.programs() if p not in earlier]
        (bound,) = program._bound.values()
        assert [n for _, n, owners in bound.sequence.steps if owners] == [len(bound.launches)]
        before = device.dma_stats()
        _raises_like_eager(fn, compiled, w, m, torch.tensor([3, 10, 1]))
        ran = device.dma_stats()["compute_items"] - before["compute_items"]
        assert 1 <= ran < len(bound.launches)  # the GEMM, not the gather
        again = compiled(w, m, index)
        torch.testing.assert_close(again, fn(w, m, index))
        assert again.shape == (3, 16) and again.dtype == torch.float32
    assert device.runtime_stats()["host_fallback_ops"] == 0

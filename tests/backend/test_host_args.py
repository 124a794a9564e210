"""How a compiled graph hands its call's arguments to the device program
(``simaccel.host_args.HostArrays``): the per-call path every backend test runs through.

Lifted floats arrive as 0-d tensors Dynamo makes per call; they only feed the constant
bank, so they are passed as exact Python numbers instead of numpy views."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from simaccel.host_args import NO_DATA, HostArrays


@pytest.mark.parametrize("value,dtype", [(0.1, torch.float64), (-0.0, torch.float64),
                                         (float("nan"), torch.float64), (1e-45, torch.float32),
                                         (2 ** 62 + 1, torch.int64), (-7, torch.int32),
                                         (True, torch.bool)])
def test_scalar_inputs_become_exact_python_numbers(value, dtype) -> None:
    x = torch.arange(4, dtype=torch.float32)
    scalar = torch.tensor(value, dtype=dtype)
    host, ptrs = HostArrays(3, frozenset({1, 2}))([x, scalar, 3])
    assert isinstance(host[0], np.ndarray) and ptrs[0] == x.data_ptr()
    expected = scalar.item()
    assert type(host[1]) is type(expected) and ptrs[1] == 0
    assert np.array_equal(np.array(host[1]), np.array(expected), equal_nan=True)
    assert np.signbit(host[1]) == np.signbit(expected)
    assert host[2] == 3


def test_zero_d_tensors_outside_the_bank_stay_arrays() -> None:
    scalar = torch.tensor(2.5, dtype=torch.float64)
    host, ptrs = HostArrays(1, frozenset())([scalar])
    assert isinstance(host[0], np.ndarray) and host[0].shape == ()
    assert ptrs[0] == scalar.data_ptr()
    half = torch.tensor(1.5, dtype=torch.float16)  # no bank slot for float16: its bits
    host, _ = HostArrays(1, frozenset({0}))([half])
    assert isinstance(host[0], np.ndarray) and host[0].dtype == np.int16
    assert host[0].view(np.float16) == 1.5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_float_inputs_pass_as_views_of_their_bits(dtype) -> None:
    """A mixed-precision activation takes the per-call fast path: an int16 view of the
    caller's memory (no copy), its own address, a strided one keeps its strides."""
    x = torch.linspace(-3, 3, 12, dtype=dtype).reshape(3, 4)
    for t in (x, x.t()):
        host, ptrs = HostArrays(1, frozenset())([t])
        assert host[0].dtype == np.int16 and host[0].shape == tuple(t.shape)
        assert host[0].strides == tuple(s * 2 for s in t.stride())
        assert ptrs[0] == t.data_ptr() == host[0].__array_interface__["data"][0]
        assert torch.equal(torch.from_numpy(host[0].copy()).view(dtype), t)


def test_a_static_address_input_keeps_its_view_while_it_is_the_same_memory() -> None:
    """StaticViews: the same tensor at the same address, sizes and strides reuses its
    view (so it sees in-place updates); another tensor, or the same one re-pointed by
    ``set_``, gets a view of its own memory."""
    from simaccel.host_args import StaticViews
    kept = StaticViews({0})
    p = torch.nn.Parameter(torch.arange(6, dtype=torch.float32))
    first, ptr = kept.host_array(0, p)
    again, _ = kept.host_array(0, p)
    assert again is first and ptr == p.data_ptr()
    with torch.no_grad():
        p.add_(1)
    assert again[0] == 1.0  # a view of the parameter's memory
    q = torch.nn.Parameter(torch.zeros(6))
    assert kept.host_array(0, q)[0] is not first
    with torch.no_grad():
        p.set_(torch.full((2, 3), 7.0))
    view, ptr = kept.host_array(0, p)
    assert view.shape == (2, 3) and view[0, 0] == 7.0 and ptr == p.data_ptr()


def test_a_static_shape_graph_finds_a_kept_view_by_tensor_and_address() -> None:
    """With ``dynamic=False`` Dynamo's tensor guards checked sizes and strides before the
    call: the kept view is found by tensor and address alone; memory that moved (``set_``,
    another tensor) still gets a view of its own."""
    from simaccel.host_args import StaticViews
    kept = StaticViews({0}, dynamic=False)
    p = torch.nn.Parameter(torch.arange(6, dtype=torch.float32))
    first, ptr = kept.host_array(0, p)
    assert kept.host_array(0, p) == (first, ptr)
    with torch.no_grad():
        p.set_(torch.full((6,), 7.0))
    moved, new_ptr = kept.host_array(0, p)
    assert moved is not first and new_ptr == p.data_ptr() != ptr and moved[0] == 7.0
    assert kept.host_array(0, torch.zeros(6))[0] is not moved


def test_the_same_parameters_again_take_the_bulk_path_and_see_every_change() -> None:
    """A static-shape graph's kept views for a call passing the very tensors at the same
    addresses (the bulk path) equal the per-index loop's; an in-place update moves the
    key by one version, memory swapped in by ``.data =`` (no version bump) a new view."""
    from simaccel.host_args import StaticViews, next_version_key
    kept = StaticViews({0, 1}, dynamic=False)
    indices = [0, 1]
    p, q = (torch.nn.Parameter(torch.arange(4, dtype=torch.float32)) for _ in range(2))

    def call() -> tuple[dict, dict, dict]:
        host, ptrs, keys = {}, {}, {}
        kept.host_arrays(indices, [p, q], host, ptrs, keys)
        return host, ptrs, keys
    first = call()
    again = call()
    assert kept._last is not None  # the second call took the bulk path
    assert all(again[0][i] is first[0][i] for i in indices)
    assert again[1:] == first[1:] and again[1][0] == p.data_ptr()
    with torch.no_grad():
        q.add_(1)
    updated = call()
    assert updated[2][1] == next_version_key(first[2][1]) and updated[2][0] == first[2][0]
    p.data = torch.full((4,), 5.0)
    swapped = call()
    assert swapped[1][0] == p.data_ptr() != first[1][0] and swapped[0][0][0] == 5.0
    assert swapped[2][0][0] != first[2][0][0]  # another token: the device uploads it


@pytest.mark.parametrize("grads", ["new", "in_place"])
def test_an_optimizer_step_reads_its_state_through_kept_views_and_equals_eager(grads) -> None:
    """Gradients as training gives them: new tensors every step (``zero_grad`` to None),
    or the same tensors written in place (accumulated; their kept views see it)."""
    import simaccel
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(3)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=False)
    ref_opt = torch.optim.SGD(ref, lr=0.1, momentum=0.9, foreach=False)
    torch._dynamo.reset()
    simaccel.get_device().reset_stats()
    step = torch.compile(opt.step, backend="simaccel")
    for i in range(6):
        for p, r in zip(params, ref):
            if grads == "new" or p.grad is None:
                p.grad = torch.randn_like(p)
            else:
                p.grad.copy_(torch.randn_like(p))
            r.grad = p.grad.clone()
        (step if i else opt.step)()
        ref_opt.step()
        for p, r in zip(params, ref):
            torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)
    stats = simaccel.get_device().runtime_stats()
    assert stats["kernel_launches"] > 0 and stats["host_fallback_ops"] == 0
    # the optimizer's state reaches the graph as module-held tensors, passed without
    # AOTAutograd's runtime wrapper; the in-place updates bump versions as eager does
    assert "module-held tensor(s) passed first" in simaccel.reports()[-1].call_path
    assert "version-bumped" in simaccel.reports()[-1].call_path


def test_a_small_plain_input_keeps_its_view_while_it_is_the_same_memory() -> None:
    """A per-call input of at most KEEP_VIEW_MAX_BYTES: the same tensor at the same
    address, sizes and strides reuses its view; memory that moved (``set_``), a reshape
    in place, or another tensor gets a view of its own. A larger input is never kept."""
    from simaccel.host_args import KEEP_VIEW_MAX_BYTES
    convert = HostArrays(2)
    small = torch.arange(6, dtype=torch.float32)
    large = torch.zeros(KEEP_VIEW_MAX_BYTES // 4 + 1)
    first, ptrs = convert([small, large])
    again, _ = convert([small, large])
    assert again[0] is first[0] and ptrs[0] == small.data_ptr()
    assert again[1] is not first[1]
    small.add_(1)
    assert again[0][0] == 1.0  # a view of the tensor's memory
    small.set_(small.untyped_storage(), 0, (2, 3))  # same address, other sizes
    reshaped, _ = convert([small, large])
    assert reshaped[0].shape == (2, 3)
    small.set_(torch.full((6,), 7.0))
    moved, ptrs = convert([small, large])
    assert moved[0][0] == 7.0 and ptrs[0] == small.data_ptr()
    assert convert([torch.zeros(6), large])[0][0] is not moved[0]
    convert([large, large])
    assert 0 not in convert._small  # the last small tensor there is not held any longer


def test_a_kept_view_keys_its_contents_by_token_and_version() -> None:
    """A resident input's content key: the same memory and version keeps its key (no
    upload), an in-place update moves it by one version, another tensor gets another
    token, and the write-back view is the kept view itself."""
    from simaccel.host_args import StaticViews, next_version_key
    kept = StaticViews({0})
    p = torch.nn.Parameter(torch.arange(6, dtype=torch.float32))
    view, _ = kept.host_array(0, p)
    key = kept.content_key(0, p)
    assert kept.content_key(0, p) == key
    assert kept.writeback_view(0, p, view) is view
    with torch.no_grad():
        p.add_(1)
    assert kept.content_key(0, p) == next_version_key(key)
    q = torch.nn.Parameter(torch.arange(6, dtype=torch.float32))
    kept.host_array(0, q)
    assert kept.content_key(0, q)[0] != key[0]


def test_host_arrays_convert_whatever_each_position_holds() -> None:
    """HostArrays sorts the positions once (kept views, bank scalars, the rest); a value
    other than the usual kind at a position still gets the general conversion."""
    from simaccel.host_args import StaticViews
    p = torch.nn.Parameter(torch.arange(4, dtype=torch.float32))
    convert = HostArrays(6, frozenset({2, 3}), StaticViews({0}, dynamic=False))
    grad = torch.ones(4, requires_grad=True)  # not plain: the general conversion
    args = [p, torch.arange(3), torch.tensor(0.5), torch.ones(2), 1.5, grad]
    for _ in range(2):  # the second call finds p's kept view
        host, ptrs = convert(args)
        assert isinstance(host[0], np.ndarray) and ptrs[0] == p.data_ptr()
        assert np.array_equal(host[1], [0, 1, 2]) and ptrs[1] == args[1].data_ptr()
        assert host[2] == 0.5 and type(host[2]) is float and ptrs[2] == 0
        assert isinstance(host[3], np.ndarray) and ptrs[3] == args[3].data_ptr()  # not 0-d
        assert host[4] == 1.5 and ptrs[4] == 0
        assert np.array_equal(host[5], np.ones(4)) and ptrs[5] == grad.data_ptr()
    first = host[0]
    assert convert(args)[0][0] is first
    host, _ = convert([3.0, None, 2, 7, 1.5, grad])  # numbers, an erased effect token
    assert host[0] == 3.0 and host[1] is NO_DATA and host[2] == 2 and host[3] == 7


def _graphs_made(fn, *calls) -> list:
    """The CompiledGraphs a ``torch.compile(fn, backend="simaccel", ...)`` made over
    ``calls`` (each a tuple of arguments), each result compared with eager."""
    from simaccel import compiled
    made = []
    first_call = compiled.CompiledGraph._first_call

    def spy(self, args):
        made.append(self)
        return first_call(self, args)
    torch._dynamo.reset()
    compiled.CompiledGraph._first_call = spy
    try:
        for args, compiled_fn in calls:
            torch.testing.assert_close(compiled_fn(*args), fn(*args))
    finally:
        compiled.CompiledGraph._first_call = first_call
    return made


def test_a_lifted_int_leaves_a_static_shape_graphs_tensor_sizes_pinned() -> None:
    """A lifted int is a size symbol, but with ``dynamic=False`` Dynamo's tensor guards
    still pin every tensor's sizes and strides: the call re-checks none of them."""
    def fn(x, n):
        return x * n + 1

    compiled_fn = torch.compile(fn, backend="simaccel", dynamic=False)
    x = torch.randn(8)
    graphs = _graphs_made(fn, *[((x, n), compiled_fn) for n in (3, 4, 5)])
    assert len(graphs) == 1 and graphs[0].program.spec.symbols
    assert graphs[0]._host_arrays._dynamic is False


def test_a_dynamic_tensor_size_read_from_an_int_keeps_the_sizes_checked() -> None:
    """``dynamic=True``: Dynamo passes the tensor's length as an int argument of its own,
    so the program reads every symbol from an int; the tensor's sizes vary all the same,
    so each call checks them (the same tensor resized in place at the same address gets
    a view of its new size)."""
    def fn(x, n):
        return x[:n] * 2

    compiled_fn = torch.compile(fn, backend="simaccel", dynamic=True)
    x = torch.arange(12, dtype=torch.float32)
    calls = [((x, 12), compiled_fn)]
    graphs = _graphs_made(fn, *calls)
    assert all(source.dim is None for source in graphs[-1].program.spec.symbols)
    assert graphs[-1]._host_arrays._dynamic is True
    x.resize_(10)  # same address, another size
    torch.testing.assert_close(compiled_fn(x, 10), fn(x, 10))

"""Bad input: clear errors from simaccel.errors, host fallback with a reason, and a device
that stays usable afterwards."""
from __future__ import annotations

import pytest
import torch

import simaccel
from simaccel.errors import InvalidOptionError, UnsupportedOpError


def _device_still_works():
    """A new graph compiles and runs, and once it is gone the device holds no more
    memory than before it: nothing leaked by the error before."""
    torch._dynamo.reset()
    baseline = _allocated()
    x = torch.randn(5)
    compiled = torch.compile(lambda x: x * 3 + 1, backend="simaccel")
    torch.testing.assert_close(compiled(x), x * 3 + 1)
    del compiled
    torch._dynamo.reset()
    assert _allocated() == baseline


def _allocated() -> int:
    import gc
    gc.collect()
    return simaccel.get_device().memory_stats()["allocated_bytes.all.current"]


def root_cause(err: BaseException) -> BaseException:
    """Dynamo wraps backend errors in BackendCompilerFailed; find simaccel's own."""
    while True:
        inner = getattr(err, "inner_exception", None) or err.__cause__
        if inner is None or isinstance(err, simaccel.errors.SimAccelError):
            return err
        err = inner


def test_unknown_option_names_it_and_lists_valid_ones():
    with pytest.raises(Exception) as info:
        torch.compile(lambda x: x + 1, backend="simaccel", options={"fusion": "max"})(torch.ones(2))
    err = root_cause(info.value)
    assert isinstance(err, InvalidOptionError)
    assert "fusion" in str(err) and "fallback" in str(err) and "lift" in str(err)
    _device_still_works()


def test_complex_input_runs_as_a_library_call_on_the_device():
    """Complex arithmetic is a vendor-library call on device buffers
    (:mod:`simaccel.codegen.library_calls`): no host fallback, operands moved by DMA."""
    z = torch.randn(4, dtype=torch.complex64)
    out = torch.compile(lambda z: z * z, backend="simaccel")(z)
    torch.testing.assert_close(out, z * z)
    assert simaccel.reports()[-1].host_fallbacks == []
    stats = simaccel.get_device().runtime_stats()
    assert stats["host_fallback_ops"] == 0 and stats["kernel_launches"] == 1, stats
    assert simaccel.get_device().dma_stats()["d2h.bytes"] == out.numel() * out.element_size()
    _device_still_works()


def test_unsupported_op_takes_host_path_or_raises_with_fallback_error():
    x = torch.randn(10)
    fn = lambda x: torch.mode(x).values * 2  # noqa: E731 - mode has no device lowering
    out = torch.compile(fn, backend="simaccel")(x)
    torch.testing.assert_close(out, fn(x))
    assert any("mode" in op for op, _ in simaccel.reports()[-1].host_fallbacks)
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(fn, backend="simaccel", options={"fallback": "error"})(x)
    err = root_cause(info.value)
    assert isinstance(err, UnsupportedOpError) and "mode" in str(err)
    _device_still_works()


def test_bad_fallback_value():
    with pytest.raises(Exception, match="fallback"):
        torch.compile(lambda x: x + 1, backend="simaccel",
                      options={"fallback": "maybe"})(torch.ones(2))

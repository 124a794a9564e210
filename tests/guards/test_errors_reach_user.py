"""simaccel's errors reach the user unwrapped: ``except simaccel.errors.X`` works around
``torch.compile`` (not only through Dynamo's ``BackendCompilerFailed.inner_exception``)."""
from __future__ import annotations

import traceback

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed

import simaccel
from simaccel.errors import InvalidOptionError, SimAccelError, UnsupportedOpError
from simaccel.guards.dynamo.errors import errors_reach_user, passing_dynamo


def _mode_twice(x: torch.Tensor) -> torch.Tensor:
    return torch.mode(x).values * 2  # mode has no device lowering


def test_unsupported_op_error_is_caught_by_its_own_class() -> None:
    compiled = torch.compile(_mode_twice, backend="simaccel", options={"fallback": "error"})
    try:
        compiled(torch.randn(10))
    except UnsupportedOpError as err:
        caught = err
    else:
        pytest.fail("fallback='error' compiled an op without a device lowering")
    assert not isinstance(caught, BackendCompilerFailed)
    assert "mode" in caught.op and "mode" in str(caught) and caught.reason
    assert type(caught).__name__ == "UnsupportedOpError"
    shown = "".join(traceback.format_exception(caught))
    assert "simaccel.errors.UnsupportedOpError: " in shown
    assert "output_graph.py" not in shown  # Dynamo's frames are trimmed, as for its own


def test_invalid_option_error_is_caught_by_its_own_class() -> None:
    compiled = torch.compile(lambda x: x + 1, backend="simaccel", options={"lift": 3})
    with pytest.raises(InvalidOptionError, match="option 'lift' must be"):
        compiled(torch.ones(2))


def test_cause_is_kept_on_the_inner_exception() -> None:
    """Dynamo re-raises with ``from None``: the original error, with its cause, stays
    reachable as ``inner_exception``."""
    guard = simaccel.Guard("L['x']", lambda x: x.no_such_attribute, "test.broken")
    compiled = torch.compile(lambda x: x + 1, backend="simaccel", options={"guards": [guard]})
    with pytest.raises(InvalidOptionError) as info:
        compiled(torch.ones(2))
    assert info.value.__cause__ is None
    assert isinstance(info.value.inner_exception.__cause__, AttributeError)


def test_suppress_errors_still_runs_the_frame_in_eager() -> None:
    """As with BackendCompilerFailed: Dynamo's suppress_errors falls back to eager."""
    compiled = torch.compile(_mode_twice, backend="simaccel", options={"fallback": "error"})
    x = torch.randn(10)
    with torch._dynamo.config.patch(suppress_errors=True):
        torch.testing.assert_close(compiled(x), _mode_twice(x))


def test_copy_keeps_message_and_attributes() -> None:
    err = UnsupportedOpError("aten.sort.default", "no device lowering")
    copy = passing_dynamo(err, None)
    assert isinstance(copy, UnsupportedOpError) and isinstance(copy, SimAccelError)
    assert (str(copy), copy.op, copy.reason) == (str(err), err.op, err.reason)
    assert copy.inner_exception is err
    assert type(passing_dynamo(err, None)) is type(copy)  # one class per error class


def test_other_errors_pass_as_they_are() -> None:
    @errors_reach_user
    def backend(gm, example_inputs):
        raise KeyError("not simaccel's")

    with pytest.raises(KeyError) as info:
        backend(None, [])
    assert type(info.value) is KeyError
    assert backend.__name__ == "backend"  # Dynamo names the backend by it


def test_device_still_compiles_afterwards() -> None:
    torch._dynamo.reset()
    x = torch.randn(5)
    torch.testing.assert_close(torch.compile(lambda x: x * 3, backend="simaccel")(x), x * 3)
    assert simaccel.get_device().runtime_stats()["kernel_launches"] > 0

"""How a compiled graph hands its call's arguments to the device program
(``simaccel.compiled._host_arrays``): the per-call path every backend test runs through.

Lifted floats arrive as 0-d tensors Dynamo makes per call; they only feed the constant
bank, so they are passed as exact Python numbers instead of numpy views."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from simaccel.compiled import _host_arrays


@pytest.mark.parametrize("value,dtype", [(0.1, torch.float64), (-0.0, torch.float64),
                                         (float("nan"), torch.float64), (1e-45, torch.float32),
                                         (2 ** 62 + 1, torch.int64), (-7, torch.int32),
                                         (True, torch.bool)])
def test_scalar_inputs_become_exact_python_numbers(value, dtype) -> None:
    x = torch.arange(4, dtype=torch.float32)
    scalar = torch.tensor(value, dtype=dtype)
    host, ptrs = _host_arrays([x, scalar, 3], frozenset({1, 2}))
    assert isinstance(host[0], np.ndarray) and ptrs[0] == x.data_ptr()
    expected = scalar.item()
    assert type(host[1]) is type(expected) and ptrs[1] == 0
    assert np.array_equal(np.array(host[1]), np.array(expected), equal_nan=True)
    assert np.signbit(host[1]) == np.signbit(expected)
    assert host[2] == 3


def test_zero_d_tensors_outside_the_bank_stay_arrays() -> None:
    scalar = torch.tensor(2.5, dtype=torch.float64)
    host, ptrs = _host_arrays([scalar], frozenset())
    assert isinstance(host[0], np.ndarray) and host[0].shape == ()
    assert ptrs[0] == scalar.data_ptr()
    half = torch.tensor(1.5, dtype=torch.float16)  # no bank slot for float16: its bits
    host, _ = _host_arrays([half], frozenset({0}))
    assert isinstance(host[0], np.ndarray) and host[0].dtype == np.int16
    assert host[0].view(np.float16) == 1.5

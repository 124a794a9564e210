"""Which kernels run their outer loop with prange: by work (elements x work per element),
not by elements alone (issue 16 item 3; the figures behind the bound are in
``simaccel.codegen.emit``). The prange kernels' results are checked by the op tables and
test_vector_math; this pins the decision."""
from __future__ import annotations

from simaccel.codegen.emit import (PARALLEL_THRESHOLD, PARALLEL_WORK, element_work,
                                   parallel_loop)
from simaccel.codegen.ir import Const, Load, Op
from tests.codegen.child import run_child_program

X = Load("x", "i", "float32")
ADD = Op("add", (X, Const(1.0, "float32")), "float32")
#: an attention softmax pass: exp(x - max)
EXP = Op("exp", (Op("sub", (X, Load("m", "i // 128", "float32")), "float32"),), "float32")


def test_work_counts_each_distinct_op_once_and_transcendentals_as_many_adds():
    assert element_work([X]) == 1
    assert element_work([ADD]) == 2
    assert element_work([Op("mul", (ADD, ADD), "float32")]) == 3  # ADD is one node
    assert element_work([EXP]) > 8 * element_work([ADD])


def test_cheap_loops_stay_serial_below_half_a_million_elements_costly_ones_do_not():
    assert not parallel_loop(262144, [ADD])  # measured: 2x slower with prange
    assert parallel_loop(524288, [ADD])
    assert parallel_loop(PARALLEL_THRESHOLD, [X])
    assert parallel_loop(4 * 128 * 8 * 128, [EXP])  # the 4x8x128x128 attention scores
    assert parallel_loop(65536, [EXP])  # measured on GPT-2's softmax and GELU: wins
    assert not parallel_loop(16384, [EXP])
    assert PARALLEL_WORK <= PARALLEL_THRESHOLD


THREADS_PROGRAM = """
import json, torch
torch.set_num_threads(1)
import simaccel
x = torch.randn(512, 512)
fn = torch.compile(lambda x: torch.tanh(x) * torch.exp(x), backend="simaccel",
                   options={"tier0": False})
expected = torch.tanh(x) * torch.exp(x)
ok = all(torch.allclose(fn(x), expected, rtol=1e-5, atol=1e-6) for _ in range(2))
sources = [open(k.path).read() for r in simaccel.reports() for k in r.kernels]
print(json.dumps({"threads": torch.get_num_threads(), "ok": ok,
                  "prange": any("parallel=True" in s for s in sources)}))
"""


def test_a_prange_kernel_leaves_torch_thread_count_alone(tmp_path):
    """numba and PyTorch share one OpenMP runtime: numba starting its threads inside the
    first prange compile reset the user's ``torch.set_num_threads(1)`` to 2 (and under
    Dynamo's tracing, Dynamo raised). A new process, so numba's threads start in it."""
    result = run_child_program(THREADS_PROGRAM, tmp_path / "cache")
    assert result == {"threads": 1, "ok": True, "prange": True}


def _salt() -> int:
    from simaccel.codegen import parfor_names
    return parfor_names._SALT[0]


def test_parallel_loop_function_names_are_salted_per_process():
    """simaccel.codegen.parfor_names: numba names a prange loop's function by its loop
    object's hash, an address two forked compile workers can share; the salted hash
    differs between a process and each worker it forks, and is stable per object."""
    import multiprocessing

    from numba.parfors.parfor import Parfor

    from simaccel.codegen import kernel_lib, parfor_names  # noqa: F401 - installs it
    assert Parfor.__hash__ is parfor_names._salted_hash
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_salt) != _salt()
    loop = object.__new__(Parfor)
    assert hash(loop) == hash(loop) != id(loop)

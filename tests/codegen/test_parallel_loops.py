"""Which kernels run their outer loop with prange: by work (elements x work per element),
not by elements alone (issue 16 item 3; the figures behind the bound are in
``simaccel.codegen.emit``). The prange kernels' results are checked by the op tables and
test_vector_math; this pins the decision."""
from __future__ import annotations

from simaccel.codegen.emit import (PARALLEL_THRESHOLD, PARALLEL_WORK, element_work,
                                   parallel_loop)
from simaccel.codegen.ir import Const, Load, Op

X = Load("x", "i", "float32")
ADD = Op("add", (X, Const(1.0, "float32")), "float32")
#: an attention softmax pass: exp(x - max)
EXP = Op("exp", (Op("sub", (X, Load("m", "i // 128", "float32")), "float32"),), "float32")


def test_work_counts_each_distinct_op_once_and_transcendentals_as_many_adds():
    assert element_work([X]) == 1
    assert element_work([ADD]) == 2
    assert element_work([Op("mul", (ADD, ADD), "float32")]) == 3  # ADD is one node
    assert element_work([EXP]) > 8 * element_work([ADD])


def test_cheap_loops_stay_serial_below_a_million_elements_costly_ones_do_not():
    assert not parallel_loop(262144, [ADD])  # measured: 2x slower with prange
    assert parallel_loop(PARALLEL_THRESHOLD, [X])
    assert parallel_loop(4 * 128 * 8 * 128, [EXP])  # the 4x8x128x128 attention scores
    assert not parallel_loop(131072, [EXP])  # measured: loses with the other core busy
    assert PARALLEL_WORK > PARALLEL_THRESHOLD

"""Parts of a fused pointwise launch sharing one loop nest
(:func:`simaccel.codegen.fusion.share_loop_nests`): a part joins the nest of an earlier
part it shares operands with only where every iteration still sees what the separate
loops would have; the shared nest's kernel, compiled and in its tier-0 form, computes
what the separate ones do."""
from __future__ import annotations

import numpy as np

from simaccel.codegen import numpy_lib
from simaccel.codegen.compile import _own_parts
from simaccel.codegen.emit_pointwise import emit_pointwise
from simaccel.codegen.emit_numpy import emit_numpy_pointwise
from simaccel.codegen.fusion import share_loop_nests
from simaccel.codegen.ir import Const, Layout, Load, Op, PointwiseKernel

SHAPE = (8, 16)
ROW_MAJOR = "i0*16 + i1"
TRANSPOSED = "i1*8 + i0"


def _load(buffer: str, offset: str = ROW_MAJOR) -> Load:
    return Load(buffer, offset, "float32")


def _op(name: str, *args) -> Op:
    return Op(name, tuple(args), "float32")


def _part(name: str, out: str, body) -> PointwiseKernel:
    return PointwiseKernel(name, Layout(out, SHAPE, (16, 1)), body, ["i0", "i1"])


def _momentum_then_parameter() -> list[PointwiseKernel]:
    """``buf = 0.9 * buf + g`` then ``p = p - 0.1 * buf`` (reading the new ``buf``)."""
    momentum = _part("momentum", "buf", _op("add", _op("mul", _load("buf"),
                                                        Const(0.9, "float32")), _load("g")))
    update = _part("update", "p", _op("sub", _load("p"),
                                      _op("mul", Const(0.1, "float32"), _load("buf"))))
    return [momentum, update]


def test_a_part_reading_the_element_an_earlier_part_stored_joins_its_nest():
    nests = share_loop_nests(_momentum_then_parameter())
    assert [n.name for n in nests] == ["momentum"]
    assert [m.name for m in nests[0].mates] == ["update"]
    assert nests[0].writes == {"buf", "p"} and nests[0].reads == {"buf", "g", "p"}


def test_a_part_reading_a_stored_buffer_elsewhere_keeps_its_own_loop():
    momentum, _ = _momentum_then_parameter()
    transposed = _part("transposed", "p", _op("add", _load("p"), _load("buf", TRANSPOSED)))
    assert [n.name for n in share_loop_nests([momentum, transposed])] == \
        ["momentum", "transposed"]


def test_a_part_sharing_no_operand_keeps_its_own_loop():
    momentum, _ = _momentum_then_parameter()
    other = _part("other", "q", _op("mul", _load("x"), _load("y")))
    assert len(share_loop_nests([momentum, other])) == 2


def test_a_part_that_cannot_move_above_the_parts_between_keeps_its_own_loop():
    """The update reads ``g`` (transposed), which a part between it and the momentum's
    nest writes: in the momentum's nest it would read ``g`` before that write."""
    momentum, update = _momentum_then_parameter()
    update.body = _op("add", update.body, _load("g", TRANSPOSED))
    writes_g = _part("writes_g", "g", _op("mul", _load("x"), _load("x", TRANSPOSED)))
    nests = share_loop_nests([momentum, writes_g, update])
    assert [n.name for n in nests] == ["momentum", "writes_g", "update"]
    assert not nests[0].mates


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(SHAPE[0] * SHAPE[1]).astype(np.float32)
            for name in ("buf", "g", "p")}


def _run(source: str, args: list[str], arrays: dict[str, np.ndarray]) -> None:
    namespace: dict = {}
    exec(compile(source.replace("cache=True", "cache=False"), "<kernel>", "exec"),
         namespace)
    namespace["kernel"](*(arrays[a] for a in args))


def test_the_shared_nest_computes_what_the_separate_loops_do():
    """Compiled (numba) and in its tier-0 (numpy) form, against the two parts' own
    kernels run in turn; the update reads the momentum's new value."""
    separate = _arrays()
    for part in _momentum_then_parameter():
        _run(*emit_pointwise(part), separate)
    nest = share_loop_nests(_momentum_then_parameter())[0]
    source, args = emit_pointwise(nest)
    assert source.count("prange") + source.count(" in range(") == 2  # one nest of 2 loops
    compiled = _arrays()
    _run(source, args, compiled)
    tier0 = _arrays()
    namespace: dict = {"np": np, "lib": numpy_lib}
    exec(emit_numpy_pointwise(nest), namespace)
    namespace["kernel"](*(tier0[a] for a in args))
    for name in ("buf", "p"):
        np.testing.assert_array_equal(compiled[name], separate[name])
        np.testing.assert_allclose(tier0[name], separate[name], rtol=1e-6, atol=1e-6)


def test_a_launch_keeps_its_parts_as_lowered():
    """The nests are made of copies: the fused launch (whose cost counts each part once)
    and its parts stay as they were."""
    momentum, update = _momentum_then_parameter()
    momentum.siblings = [update]
    nests = _own_parts(momentum)
    assert [len(n.mates) for n in nests] == [1]
    assert not momentum.mates and not update.mates and momentum.siblings == [update]

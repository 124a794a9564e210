"""One folded Python guard check per frame (issue 3, guard-evaluation speed target).

A lifted frame's Python-level guards - simaccel's device-config and alignment checks, Dynamo's
``not math.isnan(...)`` on each lifted float and simaccel's int-slot range on each lifted
int - run as one epilogue LAMBDA_GUARD instead of one lambda each. Nothing is dropped: for
every value a part guards (NaN, +-inf, ints past 32 bits, another device config) the
results equal eager, a recompile happens exactly when the part fails, and the recompile
reason names that part. Dynamo's NaN guard stays even for a float that only feeds tensor
arithmetic; ``test_nan_guard_is_load_bearing`` shows why.
"""
from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import guard_failures

import simaccel
from conftest import LiftingBackend, unique_graphs
from simaccel.guards.device import ALIGNED, DEVICE_CONFIG, INT_SLOT
from simaccel.guards.folded import FoldedCheckFailed, FoldedPart, build_folded_check

X = torch.linspace(-2.0, 2.0, 16)
NAN_CHECK_A = "not math.isnan(L['a'])"
INT_RANGE_N = f"{INT_SLOT}: -2147483648 <= L['n'] < 2147483648"


def scaled(x: torch.Tensor, a: float, b: float, n: int) -> torch.Tensor:
    """The guard benchmark's frame (simaccel.bench.workloads.guard_workload)."""
    return x * a + b * n


@pytest.fixture(autouse=True)
def fresh_device() -> None:
    simaccel.clear_reports()
    simaccel.get_device().reset_stats()
    guard_failures.clear()


def guard_tree(fn: Any) -> Any:
    """The guard manager of ``fn``'s newest compiled entry."""
    entries = _debug_get_cache_entry_list(fn.__code__)
    assert entries, "nothing compiled"
    return entries[0].guard_manager


def python_guard_texts(fn: Any) -> tuple[list[str], list[list[str]]]:
    """(texts of the root's LAMBDA_GUARD leaves, code parts of each epilogue lambda)."""
    root = guard_tree(fn).root
    root_lambdas = [part for leaf in root.get_leaf_guards()
                    if type(leaf).__name__ == "LAMBDA_GUARD"
                    for part in leaf.verbose_code_parts()]
    return root_lambdas, [leaf.verbose_code_parts()
                          for leaf in root.get_epilogue_lambda_guards()]


def assert_ran_on_device() -> None:
    stats = simaccel.get_device().runtime_stats()
    assert stats["kernel_launches"] > 0 and stats["host_fallback_ops"] == 0


def reasons(fn: Any) -> list[str]:
    return list(guard_failures.get(fn.__code__, []))


def test_lifted_frame_runs_one_python_check() -> None:
    compiled = torch.compile(scaled, backend="simaccel", dynamic=False)
    torch.testing.assert_close(compiled(X, 0.75, 0.25, 3), scaled(X, 0.75, 0.25, 3))
    assert_ran_on_device()
    root_lambdas, epilogues = python_guard_texts(scaled)
    assert len(epilogues) == 1, epilogues
    parts = epilogues[0]
    assert parts[0].startswith(f"{DEVICE_CONFIG}: ")
    assert sum(p.startswith(NAN_CHECK_A) for p in parts) == 1
    assert sum(p.startswith("not math.isnan(L['b'])") for p in parts) == 1
    assert sum(p.startswith(INT_RANGE_N) for p in parts) == 1
    assert sum(p.startswith(f"{ALIGNED}: L['x']") for p in parts) == 1
    assert not any(DEVICE_CONFIG in text for text in root_lambdas)


def test_lift_off_frame_folds_only_the_device_guards() -> None:
    compiled = torch.compile(scaled, backend="simaccel", dynamic=False,
                             options={"lift": "off"})
    torch.testing.assert_close(compiled(X, 0.75, 0.25, 3), scaled(X, 0.75, 0.25, 3))
    _, epilogues = python_guard_texts(scaled)
    assert len(epilogues) == 1 and len(epilogues[0]) == 2
    assert epilogues[0][0].startswith(f"{DEVICE_CONFIG}: ")
    assert epilogues[0][1].startswith(f"{ALIGNED}: L['x'].data_ptr() % ")


def test_alignment_check_is_inline_not_a_lambda_on_the_tensor() -> None:
    """The alignment guard reads ``L['x'].data_ptr()`` inside the folded check: no
    LAMBDA_GUARD (a C++ -> Python call) hangs on the tensor's manager; a misaligned view
    fails that part, recompiles once with its reason named, and equals eager."""
    compiled = torch.compile(scaled, backend="simaccel", dynamic=False)
    torch.testing.assert_close(compiled(X, 0.75, 0.25, 3), scaled(X, 0.75, 0.25, 3))
    tensor_manager = guard_tree(scaled).root.get_child_managers()
    lambdas = [part for manager in tensor_manager for leaf in manager.get_leaf_guards()
               if type(leaf).__name__ == "LAMBDA_GUARD" for part in leaf.verbose_code_parts()]
    assert not any(ALIGNED in text for text in lambdas), lambdas
    odd = torch.linspace(-2.0, 2.0, 17)[1:]
    assert odd.data_ptr() % simaccel.get_device().config.alignment != 0
    for x in (odd, X, odd):
        torch.testing.assert_close(compiled(x, 0.75, 0.25, 3), scaled(x, 0.75, 0.25, 3))
    assert unique_graphs() == 2
    assert any(ALIGNED in reason for reason in reasons(scaled)), reasons(scaled)
    assert_ran_on_device()


@pytest.mark.parametrize("special", [math.inf, -math.inf, 1e308, -0.0])
def test_non_nan_floats_flow_through_the_lifted_graph(special: float) -> None:
    """+-inf pass every guard part (only NaN is specialized): the device constant carries
    them and the results equal eager with no recompile."""
    compiled = torch.compile(scaled, backend="simaccel", dynamic=False)
    for a, b in ((0.75, 0.25), (special, 0.25), (0.5, special), (special, special)):
        torch.testing.assert_close(compiled(X, a, b, 3), scaled(X, a, b, 3), equal_nan=True)
    assert unique_graphs() == 1
    assert_ran_on_device()


def test_nan_fails_its_part_recompiles_once_and_equals_eager() -> None:
    compiled = torch.compile(scaled, backend="simaccel", dynamic=False)
    for a in (0.75, math.nan, 1.5, math.nan, -2.0):
        torch.testing.assert_close(compiled(X, a, 0.25, 3), scaled(X, a, 0.25, 3),
                                   equal_nan=True)
    assert unique_graphs() == 2  # one lifted entry, one with NaN specialized
    assert any("not math.isnan(a)" in r for r in reasons(scaled)), reasons(scaled)
    assert_ran_on_device()


def test_int_past_32_bits_fails_its_part_and_equals_eager() -> None:
    compiled = torch.compile(scaled, backend="simaccel", dynamic=False)
    for n in (3, 2 ** 40, -2 ** 31 - 1, 7, 2 ** 31 - 1):
        torch.testing.assert_close(compiled(X, 0.75, 0.25, n), scaled(X, 0.75, 0.25, n))
    assert unique_graphs() == 2
    assert any(f"{INT_SLOT}: -2147483648 <= n < 2147483648" in r for r in reasons(scaled))
    slots = [g for r in simaccel.reports() for g in r.guards.added if g.name == INT_SLOT]
    assert {g.compiled_result for g in slots} == {True, False}


def test_device_config_change_fails_its_part() -> None:
    compiled = torch.compile(scaled, backend="simaccel", dynamic=False)
    compiled(X, 0.75, 0.25, 3)
    with simaccel.configure(dma_channels=2):
        torch.testing.assert_close(compiled(X, 0.75, 0.25, 3), scaled(X, 0.75, 0.25, 3))
    torch.testing.assert_close(compiled(X, 1.75, 0.5, 4), scaled(X, 1.75, 0.5, 4))
    assert unique_graphs() == 2
    assert any(DEVICE_CONFIG in r for r in reasons(scaled)), reasons(scaled)


def test_user_frame_guard_is_folded_and_still_flips() -> None:
    state = {"mode": "a"}
    guard = simaccel.Guard(None, lambda _frame: state["mode"] == "a", "test.mode")
    compiled = torch.compile(scaled, backend="simaccel", dynamic=False,
                             options={"guards": [guard]})
    compiled(X, 0.75, 0.25, 3)
    _, epilogues = python_guard_texts(scaled)
    assert any(p.startswith("test.mode: ") for p in epilogues[0])
    state["mode"] = "b"
    torch.testing.assert_close(compiled(X, 0.75, 0.25, 3), scaled(X, 0.75, 0.25, 3))
    compiled(X, 0.75, 0.25, 3)
    assert unique_graphs() == 2
    assert any("test.mode" in r for r in reasons(scaled))


def test_nan_guard_is_load_bearing() -> None:
    """Why Dynamo's NaN guard is not dropped for a float that only feeds tensor arithmetic:
    the shape env decides ``a == a`` at trace time (true for a real number) and leaves
    neither a guard nor a graph node, so this frame's graph is exactly ``x * a``. Only the
    NaN guard sends a NaN call to a new compile, where eager's ``-x`` branch is taken."""
    def branchy(x: torch.Tensor, a: float) -> torch.Tensor:
        return x * a if a == a else -x

    backend = LiftingBackend()
    compiled = torch.compile(branchy, backend=backend, dynamic=False)
    torch.testing.assert_close(compiled(X, 0.5), branchy(X, 0.5))
    targets = [str(n.target) for n in backend.graphs[-1].graph.nodes
               if n.op in ("call_function", "call_method")]
    assert targets == ["item", "<built-in function mul>"]  # no trace of the comparison
    assert backend.report.lifted_sources == ("L['a']",)
    # Without the NaN guard a NaN call would run this graph: NaN everywhere, not -x.
    nan_inputs = [torch.tensor(math.nan, dtype=torch.float64) if e.dim() == 0 else e
                  for e in backend.example_inputs[-1]]
    assert backend.graphs[-1](*nan_inputs)[0].isnan().all()
    torch.testing.assert_close(compiled(X, math.nan), branchy(X, math.nan))
    assert unique_graphs() == 2


def test_report_lists_the_nan_guard_of_a_lifted_float() -> None:
    compiled = torch.compile(scaled, backend="simaccel", dynamic=False)
    compiled(X, 0.75, 0.25, 3)
    guards = simaccel.reports()[-1].guards
    dropped = {d.source: d for d in guards.dropped}
    assert dropped["L['a']"].after == "TYPE_MATCH: type(L['a']) is float; " + NAN_CHECK_A
    assert dropped["L['n']"].after == "TYPE_MATCH: type(L['n']) is int"
    assert [g.source for g in guards.added if g.name == INT_SLOT] == ["L['n']"]
    assert [g.source for g in guards.added if g.name == DEVICE_CONFIG] == [""]


def test_without_a_shape_env_guard_frame_checks_stay_separate() -> None:
    """Fallback: a frame whose SHAPE_ENV guard cannot be swapped (here: removed by the
    test's backend) gets its device-config check as a root lambda of its own."""
    from simaccel.guards import device_guards
    from simaccel.guards.dynamo.frame import output_graph

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        guards = output_graph().guards
        for guard in [g for g in guards if g.create_fn_name() == "SHAPE_ENV"]:
            guards.inner.discard(guard)
        device_guards(gm, example_inputs, simaccel.get_device())
        return gm.forward

    def shifted(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 - 1.0

    compiled = torch.compile(shifted, backend=backend, dynamic=False)
    compiled(X)
    root_lambdas, epilogues = python_guard_texts(shifted)
    assert epilogues == []
    assert sum(text.startswith(f"{DEVICE_CONFIG}: ") for text in root_lambdas) == 1
    with simaccel.configure(dma_channels=2):
        torch.testing.assert_close(compiled(X), shifted(X))
    assert unique_graphs() == 2


# ---------------------------------------------------------------- the folded function itself

def test_folded_check_passes_and_names_the_failing_part() -> None:
    parts = [FoldedPart("L['n'] > 0", "n positive"), FoldedPart("L['s'] == 'a'", "s is a")]
    check = build_folded_check(parts, {}, {})
    assert check({"n": 1, "s": "a"}) is True
    with pytest.raises(FoldedCheckFailed, match="^s is a$"):
        check({"n": 1, "s": "b"})
    with pytest.raises(FoldedCheckFailed, match="^n positive$"):
        check({"n": 0, "s": "b"})


def test_folded_check_uses_closure_globals_and_cse() -> None:
    from torch._dynamo.guards import PyExprCSEPass
    parts = [FoldedPart("limit(L['cfg'].k) and G['ON']", "k under limit"),
             FoldedPart("L['cfg'].k != 3", "k not 3")]
    cse = PyExprCSEPass()
    cse.count([p.expr for p in parts])
    check = build_folded_check(parts, {"limit": lambda k: k < 10}, {"G": {"ON": True}},
                               cse.replace)

    class Cfg:
        k = 2

    assert check({"cfg": Cfg()})
    Cfg.k = 3
    with pytest.raises(FoldedCheckFailed, match="k not 3"):
        check({"cfg": Cfg()})


def test_folded_check_lets_a_part_exception_through() -> None:
    check = build_folded_check([FoldedPart("L['missing'] > 0", "missing")], {}, {})
    with pytest.raises(KeyError):
        check({})

"""simaccel.Guard: user and backend guards on frame sources (issue 4).

A guard records its check's result at compile time and passes while the result stays the
same: a check that stays true never recompiles, a flip recompiles exactly once, and the
guard shows up by name in Dynamo's guard tree and in simaccel's report.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

import simaccel
from conftest import LiftingBackend, unique_graphs
from simaccel.errors import GuardCheckError, InvalidOptionError, SimAccelError
from simaccel.guards import Guard, add_guard, frame_added_guards

TOL = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(autouse=True)
def fresh_reports() -> None:
    simaccel.clear_reports()


def guard_tree(fn: Any) -> str:
    """Dynamo's guard printout (the guard manager's string form) of fn's compiled entries."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    entries = _debug_get_cache_entry_list(fn)
    assert entries, "no compiled entry"
    return "\n".join(str(entry.guard_manager) for entry in entries)


def simaccel_error(err: BaseException) -> BaseException:
    """Dynamo wraps backend errors in BackendCompilerFailed; find simaccel's own."""
    while not isinstance(err, SimAccelError):
        inner = getattr(err, "inner_exception", None) or err.__cause__
        assert inner is not None, f"no simaccel error in {err!r}"
        err = inner
    return err


def affine(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0 + 1.0


def test_guard_that_stays_true_never_recompiles() -> None:
    seen = []
    guard = Guard("L['x']", lambda x: seen.append(1) or x.is_contiguous(), "test.contiguous")
    compiled = torch.compile(affine, backend="simaccel", options={"guards": [guard]})
    for _ in range(20):
        x = torch.randn(64)
        torch.testing.assert_close(compiled(x), affine(x), **TOL)
    assert unique_graphs() == 1
    assert len(seen) >= 20  # the check really runs on every call


def test_guard_that_flips_recompiles_exactly_once() -> None:
    state = {"fast": True}
    guard = Guard("L['x']", lambda x: state["fast"], "test.mode")
    compiled = torch.compile(affine, backend="simaccel", options={"guards": [guard]})
    for i in range(20):
        state["fast"] = i < 10
        x = torch.randn(64)
        torch.testing.assert_close(compiled(x), affine(x), **TOL)
        assert unique_graphs() == (1 if i < 10 else 2)
    state["fast"] = True  # back to the first compile's result: its entry still serves
    x = torch.randn(64)
    torch.testing.assert_close(compiled(x), affine(x), **TOL)
    assert unique_graphs() == 2


def test_check_false_at_compile_time_is_what_the_guard_keeps() -> None:
    guard = Guard("L['x']", lambda x: bool(x.sum() > 1e9), "test.huge")
    compiled = torch.compile(affine, backend="simaccel", options={"guards": [guard]})
    for _ in range(5):
        compiled(torch.randn(8))
    assert unique_graphs() == 1
    x = torch.full((8,), 1e9)
    torch.testing.assert_close(compiled(x), affine(x), **TOL)
    assert unique_graphs() == 2
    added = simaccel.reports()[0].guards.added
    assert [g.compiled_result for g in added if g.name == "test.huge"] == [False]
    assert "test.huge: not (" in guard_tree(affine)


def test_added_guards_in_report_and_dynamo_printout() -> None:
    guard = Guard("L['x']", lambda x: x.dim() == 1, "test.one_dim", "L['x'].dim() == 1")
    compiled = torch.compile(affine, backend="simaccel", options={"guards": [guard]})
    compiled(torch.randn(16))
    report = simaccel.reports()[-1].guards
    names = {g.name: g for g in report.added}
    assert set(names) >= {"test.one_dim", "simaccel.device_config", "simaccel.aligned"}
    assert names["test.one_dim"].added_by == "user"
    assert names["simaccel.aligned"].added_by == "simaccel"
    text = str(simaccel.reports()[-1])
    assert "added guards:" in text and "test.one_dim: L['x'].dim() == 1" in text
    tree = guard_tree(affine)
    assert "LAMBDA_GUARD: test.one_dim: L['x'].dim() == 1" in tree
    assert "LAMBDA_GUARD: simaccel.aligned: L['x'].data_ptr() %" in tree
    assert "LAMBDA_GUARD: simaccel.device_config:" in tree


def test_guard_printout_in_torch_logs(capfd) -> None:
    """TORCH_LOGS=guards (torch's own handler writes to stderr)."""
    torch._logging.set_logs(guards=True)
    try:
        guard = Guard("L['x']", lambda x: True, "test.logged")
        torch.compile(affine, backend="simaccel", options={"guards": [guard]})(torch.ones(4))
    finally:
        torch._logging.set_logs()
    err = capfd.readouterr().err
    assert "LAMBDA_GUARD: test.logged: test_guard_printout_in_torch_logs.<lambda>(L['x'])" in err


# ---------------------------------------------------------------- sources

CFG = {"mode": "fast"}


def scaled_by_mode(x: torch.Tensor) -> torch.Tensor:
    return x * 3.0


class Scaler(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 2.0
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


def test_global_dict_item_source() -> None:
    guard = Guard("G['CFG']['mode']", lambda mode: mode == "fast", "test.cfg_mode")
    compiled = torch.compile(scaled_by_mode, backend="simaccel", options={"guards": [guard]})
    x = torch.randn(8)
    compiled(x)
    compiled(x)
    assert unique_graphs() == 1
    CFG["mode"] = "slow"
    try:
        torch.testing.assert_close(compiled(x), scaled_by_mode(x), **TOL)
        assert unique_graphs() == 2
    finally:
        CFG["mode"] = "fast"
    assert "test.cfg_mode" in guard_tree(scaled_by_mode)


def test_module_attribute_source_and_resident_parameters() -> None:
    model = Scaler()
    guard = Guard("L['self'].scale", lambda s: s < 10, "test.small_scale")
    compiled = torch.compile(model, backend="simaccel", options={"guards": [guard]})
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), model(x), **TOL)
    report = simaccel.reports()[-1].guards
    sources = {g.source for g in report.added if g.name == "simaccel.aligned"}
    # x only: weight and bias are resident (their alignment is checked at each upload)
    assert sources == {"L['x']"}
    resident = [fact for fact in report.device_plan.inputs.values() if fact.get("resident")]
    assert len(resident) == 2
    assert "test.small_scale" in {g.name for g in report.added}
    model.scale = 50.0
    torch.testing.assert_close(compiled(x), model(x), **TOL)
    assert unique_graphs() == 2


def test_frame_level_guard_gets_the_frame_locals() -> None:
    seen: list[Any] = []
    guard = Guard(None, lambda frame: seen.append(sorted(frame)) or True, "test.frame")
    torch.compile(affine, backend="simaccel", options={"guards": [guard]})(torch.ones(4))
    assert seen and seen[0] == ["x"]


def test_same_guard_twice_is_installed_once() -> None:
    guard = Guard("L['x']", lambda x: True, "test.once")
    torch.compile(affine, backend="simaccel",
                  options={"guards": [guard, guard]})(torch.ones(4))
    assert guard_tree(affine).count("test.once") == 1


def with_graph_break(x: torch.Tensor, y: int) -> torch.Tensor:
    a = x * 2.0
    torch._dynamo.graph_break()
    return a + 1.0


def test_user_guard_skips_continuation_frames_without_its_source() -> None:
    """The continuation after a graph break has other locals (no ``y``): the guard is
    installed on the function's frame and skipped there."""
    guard = Guard("L['y']", lambda y: y > 0, "test.y_positive")
    compiled = torch.compile(with_graph_break, backend="simaccel", options={"guards": [guard]})
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x, 3), with_graph_break(x, 3), **TOL)
    per_graph = [[g.name for g in r.guards.added] for r in simaccel.reports()]
    assert len(per_graph) == 2
    assert "test.y_positive" in per_graph[0] and "test.y_positive" not in per_graph[1]
    torch.testing.assert_close(compiled(x, -3), with_graph_break(x, -3), **TOL)
    assert "test.y_positive: not (" in guard_tree(with_graph_break)


# ---------------------------------------------------------------- backend passes

def test_backend_pass_adds_guards_collected_per_frame_compile() -> None:
    collected = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]):
        add_guard(Guard("L['x']", lambda x: x.numel() < 1000, "pass.small"))
        add_guard(Guard("L['x']", lambda x: x.numel() < 1000, "pass.small"))  # de-duplicated
        collected.append(list(frame_added_guards()))
        return gm.forward

    compiled = torch.compile(affine, backend=backend)
    compiled(torch.randn(10))
    compiled(torch.randn(10))
    assert [[g.name for g in frame] for frame in collected] == [["pass.small"]]
    assert collected[0][0].added_by == "backend"
    compiled(torch.randn(2000))  # another shape recompiles anyway; the new guard says False
    assert [g.compiled_result for g in collected[1]] == [False]


def test_add_guard_after_lifting_in_a_lifting_backend() -> None:
    class PassBackend(LiftingBackend):
        def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]):
            fn = super().__call__(gm, example_inputs)
            add_guard(Guard("L['alpha']", lambda a: a > 0, "pass.positive"))
            return fn

    def fn(x: torch.Tensor, alpha: float) -> torch.Tensor:
        return x * alpha

    backend = PassBackend()
    compiled = torch.compile(fn, backend=backend)
    x = torch.randn(4)
    for alpha in (0.5, 1.5, 2.5):
        torch.testing.assert_close(compiled(x, alpha), fn(x, alpha))
    assert unique_graphs() == 1 and backend.report.lifted_sources == ("L['alpha']",)
    torch.testing.assert_close(compiled(x, -1.0), fn(x, -1.0))
    assert unique_graphs() == 2


def test_add_guard_outside_a_compile_is_an_error() -> None:
    with pytest.raises(SimAccelError, match="while Dynamo compiles"):
        add_guard(Guard("L['x']", bool, "test.outside"))


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("source,match", [
    ("L['nope']", "unknown source"),
    ("G['NO_SUCH_GLOBAL']", "unknown source"),
    ("x.shape", "unsupported syntax"),
    ("L['x'](", "not a source expression"),
])
def test_unknown_source_is_an_invalid_option_naming_the_guard(source: str, match: str) -> None:
    guard = Guard(source, bool, "test.bad_source")
    with pytest.raises(Exception) as info:
        torch.compile(affine, backend="simaccel", options={"guards": [guard]})(torch.ones(2))
    err = simaccel_error(info.value)
    assert isinstance(err, InvalidOptionError)
    assert "test.bad_source" in str(err) and match in str(err)


def test_check_raising_at_compile_time_is_an_invalid_option() -> None:
    guard = Guard("L['x']", lambda x: x.no_such_attribute, "test.broken")
    with pytest.raises(Exception) as info:
        torch.compile(affine, backend="simaccel", options={"guards": [guard]})(torch.ones(2))
    err = simaccel_error(info.value)
    assert isinstance(err, InvalidOptionError)
    assert "test.broken" in str(err) and "L['x']" in str(err)
    assert isinstance(err.inner_exception.__cause__, AttributeError)  # see guards/dynamo/errors.py


def test_check_raising_at_call_time_names_the_guard() -> None:
    """Dynamo's C++ guard counts a raising check as a failed guard and recompiles; the
    recompile reason and the error the caller gets both name the guard."""
    state = {"boom": False}

    def check(x: torch.Tensor) -> bool:
        if state["boom"]:
            raise ValueError("boom")
        return True

    guard = Guard("L['x']", check, "test.raiser")
    compiled = torch.compile(affine, backend="simaccel", options={"guards": [guard]})
    compiled(torch.ones(2))
    state["boom"] = True
    with pytest.raises(Exception) as info:
        compiled(torch.ones(2))
    err = simaccel_error(info.value)
    assert isinstance(err, GuardCheckError)
    assert "test.raiser" in str(err) and "L['x']" in str(err)
    assert isinstance(err.inner_exception.__cause__, ValueError)  # see guards/dynamo/errors.py


def test_call_time_error_text_is_the_recompile_reason() -> None:
    from simaccel.guards.added import _guard_fn

    def check(x: Any) -> bool:
        raise KeyError("k")

    guard_fn = _guard_fn(Guard("L['x']", check, "test.reason"), "L['x']", True)
    with pytest.raises(GuardCheckError, match="'test.reason' on L\\['x'\\]") as info:
        guard_fn(1)
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("bad", [
    lambda: Guard("L['x']", "not callable", "test.x"),
    lambda: Guard("L['x']", bool, ""),
    lambda: Guard(3, bool, "test.x"),
])
def test_malformed_guard_is_an_invalid_option(bad) -> None:
    with pytest.raises(InvalidOptionError):
        bad()


def test_non_guard_in_options_is_an_invalid_option() -> None:
    with pytest.raises(Exception) as info:
        torch.compile(affine, backend="simaccel",
                      options={"guards": [lambda x: True]})(torch.ones(2))
    assert isinstance(simaccel_error(info.value), InvalidOptionError)

"""Hyperparameters of torch.nn layers (``LayerNorm.eps``, ``Embedding.norm_type``,
``Softmax.dim``, ...) keep their value guard from the first trace, without a re-trace
(simaccel.guards.nn_constants).

Each entry is checked against the installed torch both ways: with the table, the frame
compiles without a re-trace and the report gives the reason; without it, lifting is
tried and Dynamo still specializes the value, so the entry is still needed (if a torch
release starts to lift one, ``test_entry_is_still_needed`` fails and the entry goes).
"""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import simaccel
import simaccel.guards.lift as lift
import simaccel.guards.policy as policy
from simaccel.guards import lift_memory
from conftest import unique_graphs

TOL = dict(rtol=1e-5, atol=1e-6)

# (test id, module factory, input factory, attribute kept)
CASES: list[tuple[str, Callable[[], nn.Module], Callable[[], torch.Tensor], str]] = [
    ("LayerNorm.eps", lambda: nn.LayerNorm(8), lambda: torch.randn(4, 8), "eps"),
    ("GroupNorm.num_groups", lambda: nn.GroupNorm(2, 8), lambda: torch.randn(4, 8, 3),
     "num_groups"),
    ("BatchNorm1d.momentum", lambda: nn.BatchNorm1d(8).eval(), lambda: torch.randn(4, 8),
     "momentum"),
    ("InstanceNorm1d.eps", lambda: nn.InstanceNorm1d(8), lambda: torch.randn(4, 8, 5), "eps"),
    ("Embedding.norm_type", lambda: nn.Embedding(10, 8), lambda: torch.randint(0, 10, (4,)),
     "norm_type"),
    # an inactive dropout leaves the graph before AOTAutograd (simaccel.pre_aot): a tanh
    # after it gives the device work
    ("Dropout.p", lambda: nn.Sequential(nn.Dropout(0.1), nn.Tanh()).eval(),
     lambda: torch.randn(4, 8), "p"),
    ("Softmax.dim", lambda: nn.Softmax(-1), lambda: torch.randn(4, 8), "dim"),
]
IDS = [case[0] for case in CASES]


@pytest.fixture(autouse=True)
def no_lifting_memory_between_processes(monkeypatch) -> None:
    """These tests compile torch.nn's own forward code, whose lifting decisions the
    file-backed memory shares between processes (xdist workers share the session's cache
    directory): ``test_entry_is_still_needed`` records a hyperparameter as specialized,
    and a later first trace in another worker read that as "an earlier trace" and
    skipped the table. Each test here starts from no earlier process's decisions and
    leaves none."""
    monkeypatch.setattr(lift_memory, "load", lambda code: {})
    monkeypatch.setattr(lift_memory, "store", lambda code, reasons: None)


def compile_once(module: nn.Module, x: torch.Tensor) -> simaccel.CompileReport:
    simaccel.clear_reports()
    compiled = torch.compile(module, backend="simaccel", dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x), **TOL)
    return simaccel.reports()[-1]


def _attribute(module: nn.Module, attr: str) -> object:
    """``attr`` of the first of ``module`` and its submodules that has it."""
    return next(getattr(m, attr) for m in module.modules() if hasattr(m, attr))


def kept_reason(report: simaccel.CompileReport, attr: str) -> str:
    found = [k.reason for k in report.guards.kept if k.source.endswith("." + attr)]
    assert len(found) == 1, report.guards
    return found[0]


#: cases whose module has another float that is lifted: re-traced once for it, with the
#: kept hyperparameter not in that re-trace's request
LIFTS_ANOTHER: set[str] = set()
#: entries whose value no ATen op reads (``F.embedding`` drops ``norm_type`` without
#: ``max_norm``): lifted, it is an input nothing reads
UNREAD_BY_ATEN = {"Embedding.norm_type"}


@pytest.mark.parametrize("case,make,make_input,attr", CASES, ids=IDS)
def test_kept_from_the_first_trace(case, make, make_input, attr) -> None:
    simaccel.get_device().reset_stats()
    report = compile_once(make(), make_input())
    assert kept_reason(report, attr).startswith("hyperparameter of torch.nn.")
    assert report.guards.retraced == (case in LIFTS_ANOTHER)  # else a single trace
    assert not any(d.source.endswith("." + attr) for d in report.guards.dropped)
    assert unique_graphs() == 1
    stats = simaccel.get_device().runtime_stats()
    assert stats["kernel_launches"] > 0 and stats["host_fallback_ops"] == 0


@pytest.mark.parametrize("case,make,make_input,attr", CASES, ids=IDS)
def test_entry_is_still_needed(monkeypatch, case, make, make_input, attr) -> None:
    """Without the table (and without the first trace's graph telling what the value is
    used for) simaccel tries to lift the value: a float on the first trace, an int by a
    re-trace. Dynamo hands it back specialized all the same."""
    monkeypatch.setattr(policy, "nn_constant_reason", lambda owner, name: None)
    monkeypatch.setattr(lift, "predict_uses",
                        lambda gm, values: {source: "value" for source, _ in values})
    report = compile_once(make(), make_input())
    if case in UNREAD_BY_ATEN:  # a float: lifted on the first trace, read by no op
        assert [s.source for s in report.guards.lifted] == [f"L['fn'].{attr}"]
        assert not report.guards.retraced
        return
    assert not any(s.source.endswith("." + attr) for s in report.guards.lifted)
    reason = kept_reason(report, attr)
    assert not reason.startswith("hyperparameter")
    if isinstance(_attribute(make(), attr), float):
        assert reason.startswith("Dynamo pinned it to its value on the first trace")
    else:
        assert report.guards.retraced


def test_a_new_value_recompiles_once_and_equals_eager() -> None:
    norm = nn.LayerNorm(8)
    compiled = torch.compile(norm, backend="simaccel", dynamic=False)
    x = torch.randn(4, 8)
    with torch.no_grad():
        for eps in (1e-5, 1e-2, 1e-2):
            norm.eps = eps
            torch.testing.assert_close(compiled(x), norm(x), **TOL)
    assert unique_graphs() == 2


@pytest.mark.parametrize("make,attr", [
    (lambda: nn.LeakyReLU(0.1), "negative_slope"), (lambda: nn.ReLU6(), "max_val"),
    (lambda: nn.Threshold(0.1, 20.0), "value")], ids=["LeakyReLU", "ReLU6", "Threshold"])
def test_other_layer_floats_are_still_lifted(make, attr) -> None:
    """``LeakyReLU.negative_slope``, a clamp bound (``ReLU6.max_val``) and a ``where``
    value (``Threshold.value``) reach the device as operands read from the constant bank:
    lifted, so a new value costs no recompile."""
    act = make()
    compiled = torch.compile(act, backend="simaccel", dynamic=False)
    x = torch.randn(4, 8) * 8
    for k in range(3):
        setattr(act, attr, getattr(act, attr) + 0.5 * k)
        torch.testing.assert_close(compiled(x), act(x), **TOL)
    assert unique_graphs() == 1
    assert counters["stats"]["unique_graphs"] == 1


def test_a_transformer_block_re_traces_once_not_twice() -> None:
    """LayerNorm eps and Embedding norm_type cost no round of their own: the demo's model
    lifts its temperature and logit scale with one re-trace for them plus one for the
    head count it uses as a shape."""
    from simaccel.demo import TinyLM
    torch.manual_seed(0)
    model = TinyLM().eval()
    tokens = torch.randint(0, 64, (1, 16))
    compiled = torch.compile(model, backend="simaccel", dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens, 0.7), model(tokens, 0.7), **TOL)
    report = simaccel.reports()[-1].guards
    assert {s.source for s in report.lifted} == {"G['LOGIT_SCALE']", "L['temperature']"}
    assert not report.warnings  # norm_type no longer needs a warning after 2 re-traces
    with torch.no_grad():
        for t in (0.8, 0.9):
            torch.testing.assert_close(compiled(tokens, t), model(tokens, t), **TOL)
    assert unique_graphs() == 1

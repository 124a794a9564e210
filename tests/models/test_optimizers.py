"""Compiled ``opt.step`` with a scheduler changing lr every step (issue: lifting on real
models): one graph, parameters equal eager after every step, every update on the device.

The learning rate lives in ``param_groups[0]['lr']``; SGD and RMSprop pass it to ATen as
an ``alpha=``/``value=`` argument that AOTAutograd's tensorify pass cannot turn into a
tensor op. simaccel lowers it from the constant bank, so it stays lifted.
"""
from __future__ import annotations

import pytest

import simaccel
from optim_steps import MAX_ABS_ERROR, MAX_ABS_ERROR_OF, OPTIMIZERS, run_steps, unique_graphs

SCHEDULER_OF = {name: ("lambda", "cosine", "onecycle")[k % 3]
                for k, name in enumerate(OPTIMIZERS)}


def _assert_on_device() -> None:
    stats = simaccel.get_device().runtime_stats()
    assert stats["kernel_launches"] > 0 and stats["host_fallback_ops"] == 0, stats


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_one_graph_equal_to_eager_every_step(name: str) -> None:
    run = run_steps(name, "simaccel", SCHEDULER_OF[name])
    assert len(set(run.lrs)) == len(run.lrs), run.lrs  # lr changed at every step
    assert unique_graphs() == 1
    assert run.max_abs_error <= MAX_ABS_ERROR_OF.get(name, MAX_ABS_ERROR), run.errors
    _assert_on_device()
    lifted = simaccel.reports()[-1].guards.lifted_sources
    assert "L['self'].param_groups[0]['lr']" in lifted


@pytest.mark.parametrize("name", ["sgd_momentum", "adamw", "rmsprop_centered"])
def test_foreach_path_is_one_graph_on_the_device(name: str) -> None:
    run = run_steps(name, "simaccel", "cosine", foreach=True)
    assert unique_graphs() == 1
    assert run.max_abs_error <= MAX_ABS_ERROR, run.errors
    _assert_on_device()


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_tensor_lr_is_one_graph(name: str) -> None:
    run = run_steps(name, "simaccel", "lambda", tensor_lr=True)
    assert len(set(run.lrs)) == len(run.lrs)
    assert unique_graphs() == 1
    assert run.max_abs_error <= MAX_ABS_ERROR, run.errors
    _assert_on_device()


def test_sgd_momentum_updates_each_parameter_and_its_momentum_in_one_loop() -> None:
    """The parameter update and the momentum update of each parameter share a loop nest
    (simaccel.codegen.fusion.share_loop_nests): one kernel per parameter, not two."""
    run = run_steps("sgd_momentum", "simaccel", "lambda", steps=4)
    assert run.max_abs_error <= MAX_ABS_ERROR, run.errors
    _assert_on_device()
    kernels = simaccel.reports()[-1].kernels
    assert [k.kind for k in kernels] == ["pointwise"] * 3, kernels  # 3 parameters

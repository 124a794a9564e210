"""Lifting is never worse than Dynamo's default: for every scenario,
graphs(simaccel, lift="auto") <= graphs(Dynamo's ``eager`` backend) <= graphs(simaccel,
lift="off"), with results equal to eager on every call (issue 3's recompile matrix under
Dynamo's default and under ``dynamic=False``, and the models of this directory)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

from config_models import ConfigModel, Decoder, DecoderConfig
from optim_steps import MAX_ABS_ERROR, MAX_ABS_ERROR_OF, OPTIMIZERS, SCHEDULERS, run_steps
from tests.guards import scalar_cases


#: the three ways a scenario is compiled, in the order of the expected graph counts
BACKENDS = {"auto": ("simaccel", {"lift": "auto"}), "eager": ("eager", None),
            "off": ("simaccel", {"lift": "off"})}


def _compile(fn: Any, backend: str, dynamic: Any = None) -> Any:
    name, options = BACKENDS[backend]
    kwargs = {"options": options} if options is not None else {}
    return torch.compile(fn, backend=name, dynamic=dynamic, **kwargs)


def _matrix(case: Any, dynamic: Any) -> Callable[[str], None]:
    def run(backend: str) -> None:
        fn, args_for = case.build()
        compiled = _compile(fn, backend, dynamic)
        for value in case.values:
            args = args_for(value)
            torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-6, atol=1e-6)
    return run


def _optimizer(name: str, scheduler: str = "lambda") -> Callable[[str], None]:
    def run(backend: str) -> None:
        spec, options = BACKENDS[backend]
        result = run_steps(name, spec, scheduler, options=options)
        assert result.max_abs_error <= MAX_ABS_ERROR_OF.get(name, MAX_ABS_ERROR), result.errors
    return run


def _module_calls(make: Callable[[], torch.nn.Module], x: torch.Tensor,
                  changes: list[Callable[[torch.nn.Module], None]]) -> Callable[[str], None]:
    def run(backend: str) -> None:
        torch.manual_seed(0)
        model = make().eval()
        compiled = _compile(model, backend)
        with torch.no_grad():
            for change in changes:
                change(model)
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    return run


def _set(**values: Any) -> Callable[[torch.nn.Module], None]:
    def change(model: torch.nn.Module) -> None:
        for name, value in values.items():
            setattr(model.config, name, value)
    return change


def _host_op(backend: str) -> None:
    def fn(x, m, v, beta):
        return torch.addmv(x, m, v, beta=beta) * 2
    compiled = _compile(fn, backend)
    for beta in (0.5, 1.5, 2.5, -1.0):
        torch.manual_seed(0)
        args = (torch.randn(4), torch.randn(4, 3), torch.randn(3), beta)
        torch.testing.assert_close(compiled(*args), fn(*args))


SCENARIOS: dict[str, Callable[[str], None]] = {
    **{f"{case.name}-dynamic={dynamic}": _matrix(case, dynamic)
       for case in scalar_cases.CASES for dynamic in (None, False)},
    "sgd_lambda": _optimizer("sgd"),
    "adamw_lambda": _optimizer("adamw"),
    # every optimizer of optim_steps, each with one of the three schedulers in turn
    **{f"{name}_{scheduler}": _optimizer(name, scheduler)
       for k, name in enumerate(OPTIMIZERS)
       for scheduler in [tuple(SCHEDULERS)[k % len(SCHEDULERS)]]
       if (name, scheduler) not in (("sgd", "lambda"), ("adamw", "lambda"))},
    "decoder_slice_and_branch": _module_calls(
        lambda: Decoder(DecoderConfig()), torch.randn(2, 16),
        [_set(num_hidden_layers=n, residual_scale=s)
         for n, s in ((2, 1.0), (3, 1.0), (1, 2.0), (1, 0.5), (2, 1.0))]),
    "config_model": _module_calls(
        ConfigModel, torch.randint(0, 50, (2, 8)),
        [_set(attn_scale=s, logit_scale=2 * s) for s in (0.25, 0.5, 0.75)]),
    "host_addmv_beta": _host_op,
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_auto_never_compiles_more_than_dynamo_or_lift_off(scenario: str) -> None:
    graphs = {}
    for backend in BACKENDS:
        torch._dynamo.reset()
        counters.clear()
        SCENARIOS[scenario](backend)
        graphs[backend] = counters["stats"]["unique_graphs"]
    assert graphs["auto"] <= graphs["eager"] <= graphs["off"], graphs

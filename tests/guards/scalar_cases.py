"""Programs whose result depends on one Python scalar, one per place a scalar can live.

Each case builds a fresh program and returns ``(fn, args_for)``: ``args_for(value)`` stores
``value`` where the case keeps its scalar and returns the call arguments of ``fn``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

FLOAT_VALUES = (0.5, 1.5, 2.5, -3.0, 4.25, 7.0)
INT_VALUES = (2, 3, 5, 7, 11, 13)

GAIN = 2.0
STEPS = 3


class Holder:
    """A plain (non-Module) object with a float attribute."""

    def __init__(self) -> None:
        self.w = 0.25


class FloatModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 1.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * self.scale


class IntModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * self.k + 1


def _x() -> torch.Tensor:
    return torch.linspace(-2.0, 2.0, 8).reshape(2, 4)


def float_arg() -> tuple[Callable, Callable[[Any], tuple]]:
    def fn(x, alpha):
        return torch.sin(x) * alpha
    return fn, lambda v: (_x(), v)


def int_arg() -> tuple[Callable, Callable[[Any], tuple]]:
    def fn(x, n):
        return torch.sin(x) * n + n
    return fn, lambda v: (_x(), v)


def float_global() -> tuple[Callable, Callable[[Any], tuple]]:
    def fn(x):
        return torch.cos(x) * GAIN

    def args_for(v):
        globals()["GAIN"] = v
        return (_x(),)
    return fn, args_for


def int_global() -> tuple[Callable, Callable[[Any], tuple]]:
    def fn(x):
        return torch.cos(x) + STEPS

    def args_for(v):
        globals()["STEPS"] = v
        return (_x(),)
    return fn, args_for


def closure_cell() -> tuple[Callable, Callable[[Any], tuple]]:
    scale = 1.0

    def fn(x):
        return torch.tanh(x) * scale

    def args_for(v):
        fn.__closure__[0].cell_contents = v
        return (_x(),)
    return fn, args_for


def module_float_attr() -> tuple[Callable, Callable[[Any], tuple]]:
    module = FloatModule()

    def args_for(v):
        module.scale = v
        return (_x(),)
    return module, args_for


def module_int_attr() -> tuple[Callable, Callable[[Any], tuple]]:
    module = IntModule()

    def args_for(v):
        module.k = v
        return (_x(),)
    return module, args_for


def object_attr() -> tuple[Callable, Callable[[Any], tuple]]:
    holder = Holder()

    def fn(x, h):
        return torch.exp(x) * h.w
    return fn, lambda v: (_x(), _set(holder, "w", v))


def dict_item() -> tuple[Callable, Callable[[Any], tuple]]:
    def fn(x, cfg):
        return x - cfg["lr"] * torch.sign(x)
    return fn, lambda v: (_x(), {"lr": v, "name": "sgd"})


def list_item() -> tuple[Callable, Callable[[Any], tuple]]:
    def fn(x, coeffs):
        return x * coeffs[0] + coeffs[1]
    return fn, lambda v: (_x(), [1.0, v])


def _set(obj: Any, name: str, value: Any) -> Any:
    setattr(obj, name, value)
    return obj


@dataclass(frozen=True)
class Case:
    """One place a scalar lives; ``source`` is Dynamo's name for it."""

    name: str
    build: Callable[[], tuple[Callable, Callable[[Any], tuple]]]
    values: tuple
    source: str
    where: str


CASES = (
    Case("float_arg", float_arg, FLOAT_VALUES, "L['alpha']", "argument"),
    Case("int_arg", int_arg, INT_VALUES, "L['n']", "argument"),
    Case("float_global", float_global, FLOAT_VALUES, "G['GAIN']", "global"),
    Case("int_global", int_global, INT_VALUES, "G['STEPS']", "global"),
    Case("closure_cell", closure_cell, FLOAT_VALUES, "L['scale']", "closure cell"),
    Case("module_float_attr", module_float_attr, FLOAT_VALUES, "L['self'].scale",
         "nn.Module attribute"),
    Case("module_int_attr", module_int_attr, INT_VALUES, "L['self'].k", "nn.Module attribute"),
    Case("object_attr", object_attr, FLOAT_VALUES, "L['h'].w", "object attribute"),
    Case("dict_item", dict_item, FLOAT_VALUES, "L['cfg']['lr']", "dict item"),
    Case("list_item", list_item, FLOAT_VALUES, "L['coeffs'][1]", "list item"),
)

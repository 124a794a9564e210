"""Everything about a program that depends on the sizes of a call.

A program of static shapes has one :class:`SizedLayout`, made when it is loaded. A program
over dynamic sizes names them by symbols (:mod:`simaccel.runtime.sizes`): its memory plan
is made once, at the traced sizes, and kept as a stacking order
(:class:`~simaccel.runtime.planner.StackedPlan`); a call at new sizes evaluates every size
expression with one compiled function and re-stacks the plan (no search), and the result
is cached per size tuple.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from simaccel.errors import SimAccelError
from simaccel.runtime.planner import MemoryPlan, PlanBuffer, StackedPlan, plan_memory
from simaccel.runtime.sizes import SizeFunction
from simaccel.runtime.spec import LaunchStep, Placement, ProgramSpec

#: distinct size tuples whose layouts a program keeps (a generation loop's growing cache
#: makes a new one per step; older ones are dropped first)
MAX_LAYOUTS = 64


@dataclass(frozen=True)
class SizedLayout:
    """One size tuple's numbers: elements per buffer, the memory plan, each step's launch
    parameters and roofline cost, each output's (shape, strides, offset) in elements.
    ``key``: the values of the symbols any of these read (:meth:`Layouts.at`); a symbol
    only kernels read (an int argument used as a number, from the size bank) is in
    ``sizes`` alone, so a new value of it shares the layout, its workspace binding and
    its DMA plans."""

    sizes: tuple[int, ...]
    numel: dict[str, int]
    plan: MemoryPlan
    params: list[tuple[int, ...]]
    costs: list[tuple[float, float]]
    outputs: list[tuple[tuple[int, ...], tuple[int, ...], int] | None]
    key: tuple[int, ...]

    def with_sizes(self, sizes: tuple[int, ...]) -> SizedLayout:
        """This layout at ``sizes`` of the same key (new values of symbols only kernels
        read): a copy made in ~0.3 us where ``dataclasses.replace`` takes ~2 us, as it
        is on every call whose lifted int changed."""
        layout = object.__new__(SizedLayout)
        layout.__dict__.update(self.__dict__, sizes=sizes)
        return layout


def liveness(spec: ProgramSpec) -> list[tuple[str, int, int]]:
    """(buffer, first step, last step) of every workspace buffer, from the steps' declared
    ``reads`` and ``writes``. Resident and host-mapped inputs and host-mapped outputs take
    no workspace (they live in blocks of their own, or in host memory), nor do constants
    and scalars."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    n = len(spec.steps)
    for plan in spec.inputs_placed(Placement.COPIED):
        first[plan.buffer] = last[plan.buffer] = 0
    for k, step in enumerate(spec.steps, start=1):
        for name in (*step.reads, *step.writes):
            first.setdefault(name, k)
            last[name] = k
    for out in spec.outputs:
        if out is not None:
            first.setdefault(out.buffer, n + 1)
            last[out.buffer] = n + 1
    off_workspace = {p.buffer for p in spec.inputs_placed(Placement.RESIDENT, Placement.MAPPED,
                                                          Placement.MAPPED_UPDATE)}
    off_workspace |= {out.buffer for out in spec.outputs if out is not None and out.mapped}
    return [(name, first[name], last[name]) for name, decl in spec.buffers.items()
            if decl.kind not in ("constant", "scalar") and name in first
            and name not in off_workspace]


class Layouts:
    """Makes and caches the :class:`SizedLayout` of each size tuple of one program."""

    def __init__(self, spec: ProgramSpec):
        self.spec = spec
        self._live = liveness(spec)
        self._names = list(spec.buffers)
        steps = [s for s in spec.steps if isinstance(s, LaunchStep)]
        self._launch_index = [k for k, s in enumerate(spec.steps) if isinstance(s, LaunchStep)]
        exprs: list[Any] = [spec.buffers[n].numel for n in self._names]
        #: per launch: where its parameters start and its two costs (flops, bytes) sit in
        #: the evaluated list; per output: where its shape, strides and offset start
        self._launch_spans: list[tuple[int, int]] = []
        self._output_spans: list[tuple[int, int, int] | None] = []
        for step in steps:
            self._launch_spans.append((len(exprs), len(exprs) + len(step.params)))
            exprs += [*step.params, step.flops, step.nbytes]
        for out in spec.outputs:
            if out is None:
                self._output_spans.append(None)
                continue
            start = len(exprs)
            self._output_spans.append((start, start + len(out.shape),
                                       start + len(out.shape) + len(out.strides)))
            exprs += [*out.shape, *out.strides, out.offset]
        self._asserts_start = len(exprs)
        exprs += [condition for condition, _ in spec.size_asserts]
        self._evaluate = SizeFunction([s.symbol for s in spec.symbols], exprs)
        self._cache: OrderedDict[tuple[int, ...], SizedLayout] = OrderedDict()
        planned = spec.plan_sizes or spec.example_sizes
        traced = tuple(planned) if spec.symbols else ()
        example = self._numbers(traced)
        self._stacked: StackedPlan | None = None
        #: the bucket's plan (static-shape mode), used for every call whose buffers fit
        self._bucket_plan = None
        first = self._layout(traced, example,
                             plan_memory(self._plan_buffers(example[0]), spec.alignment),
                             self._evaluate.key(traced))
        if spec.symbols:
            self._stacked = StackedPlan(first.plan)
            if spec.plan_sizes:
                self._bucket_plan = first.plan
        self.first = first
        #: the layout :meth:`at` returned last (a call at the same sizes gets it at once)
        self._last = first

    def at(self, sizes: tuple[int, ...]) -> SizedLayout:
        """The layout for this call's sizes (the symbols' values, in ``spec.symbols``
        order)."""
        last = self._last
        if last.sizes == sizes:  # the common call: the sizes of the one before
            return last
        key = self._evaluate.key(sizes)
        if key == last.key:  # a new value of a symbol only kernels read (a lifted int)
            layout = self._last = last.with_sizes(sizes)
            return layout
        layout = self._cache.get(key)
        if layout is None:
            numbers = self._numbers(sizes)
            layout = self._layout(sizes, numbers, self._plan_for(self._nbytes(numbers[0])),
                                  key)
        else:
            self._cache.move_to_end(key)
            if layout.sizes != sizes:  # a new value of a symbol only kernels read
                layout = self._cache[key] = layout.with_sizes(sizes)
        self._last = layout
        return layout

    def _plan_for(self, nbytes: dict[str, int]):
        """The bucket's plan if every buffer fits its planned bytes, else the plan
        re-stacked for these sizes."""
        plan = self._bucket_plan
        if plan is not None and all(n <= plan.sizes[name] for name, n in nbytes.items()):
            return plan
        return self._stacked.at(nbytes) if self._stacked else self.first.plan

    def _numbers(self, sizes: tuple[int, ...]) -> tuple[dict[str, int], list, list, list]:
        values = self._evaluate(sizes)
        numel = dict(zip(self._names, values))
        # slices at positions fixed by the expression list (a new size tuple per call
        # makes these anew: a decode step with a growing KV cache)
        params = [values[start:cost] for start, cost in self._launch_spans]
        costs = [(values[cost], values[cost + 1]) for _, cost in self._launch_spans]
        outputs = [None if span is None else
                   (values[span[0]:span[1]], values[span[1]:span[2]], values[span[2]])
                   for span in self._output_spans]
        for (condition, message), holds in zip(self.spec.size_asserts,
                                               values[self._asserts_start:]):
            if not holds:
                raise SimAccelError(f"{self.spec.name}: {message} (sizes "
                                    f"{dict(zip((s.symbol for s in self.spec.symbols), sizes))})")
        return numel, params, costs, outputs

    def _nbytes(self, numel: dict[str, int]) -> dict[str, int]:
        return {name: numel[name] * self.spec.buffers[name].itemsize
                for name, _, _ in self._live}

    def _plan_buffers(self, numel: dict[str, int]) -> list[PlanBuffer]:
        nbytes = self._nbytes(numel)
        return [PlanBuffer(name, nbytes[name], first, last) for name, first, last in self._live]

    def _layout(self, sizes: tuple[int, ...], numbers: tuple, plan: MemoryPlan,
                key: tuple[int, ...]) -> SizedLayout:
        numel, params, costs, outputs = numbers
        all_params: list[tuple[int, ...]] = [()] * len(self.spec.steps)
        all_costs: list[tuple[float, float]] = [(0.0, 0.0)] * len(self.spec.steps)
        for k, p, c in zip(self._launch_index, params, costs):
            all_params[k], all_costs[k] = p, c
        layout = SizedLayout(sizes, numel, plan, all_params, all_costs, outputs, key)
        self._cache[key] = layout
        if len(self._cache) > MAX_LAYOUTS:
            self._cache.popitem(last=False)
        return layout


def output_view(base: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...],
                offset: int) -> np.ndarray:
    """The strided (elements) device view a graph output is copied back from (numpy's
    constructor, which also checks it lies inside ``base``: ~1 us where ``as_strided``
    takes ~6 us, and a new size tuple makes every output's view anew)."""
    item = base.itemsize
    view = np.ndarray(shape, base.dtype, base, offset * item, [s * item for s in strides])
    view.flags.writeable = False
    return view


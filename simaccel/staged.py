"""Graphs with data-dependent sizes as a staged program: device stages, and between them
the host steps that make a size known.

A device program needs every size before a call starts. A graph whose sizes depend on
its data (``n = x.sum().item()`` then ``torch.zeros(n)``; ``x[x > 0]``; ``nonzero``)
is split where such a size is made:

* device stages: ordinary compiled graphs (:func:`simaccel.backend.compile_graph`).
  A stage after a size is made takes it as an input: an int, or a dim of a tensor
  input, read per call like any dynamic size (one compile serves every value);
* host steps: the op that makes the size, and the size arithmetic and runtime asserts
  on it. ``.item()`` of a value a device stage computed is a readback: the stage's
  output comes device to host (counted by the DMA engine like every download) and the
  host reads the number (``device.runtime_stats()["size_readbacks"]``). ``nonzero`` and
  boolean masks are first given such a count (:mod:`simaccel.count_sizes`), so they run
  on the device. An op no kernel can size (``unique``) runs on the host, its inputs
  downloaded by the stage before and its output uploaded by the stage after, reported
  with that reason and counted as a host fallback op.

Each node goes to the earliest place its inputs allow (:func:`split_stages`), so the
work that does not depend on a data-dependent size runs in the first device stage.
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from simaccel.count_sizes import count_on_device, size_inputs
from simaccel.errors import UnsupportedOpError
from simaccel.input_plan import InputFacts
from simaccel.report import CompileReport, add_report
from simaccel.runtime.device import get_device

#: ops a host step runs because their result is a number the host reads
READBACK_OPS = frozenset({torch.ops.aten._local_scalar_dense.default})


@dataclass
class Stage:
    """A run of the graph's nodes on one side: ``on_device`` (a compiled graph) or on the
    host (torch ops in graph order). ``inputs``: values it takes from graph inputs or
    earlier stages; ``outputs``: values later stages or the graph's outputs use."""

    on_device: bool
    level: int
    nodes: list[torch.fx.Node] = field(default_factory=list)
    inputs: list[torch.fx.Node] = field(default_factory=list)
    outputs: list[torch.fx.Node] = field(default_factory=list)


def _unbacked_int_names(value: Any) -> set[str]:
    """Data-dependent int size symbols (``u0``) in a node's value: a SymInt, a SymBool, or
    a tensor's sizes and strides (unbacked floats of a float ``.item()`` are not sizes:
    the device computes them inside its kernels)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    names: set[str] = set()
    for v in values:
        if isinstance(v, (torch.Tensor, torch.SymInt, torch.SymBool, torch.SymFloat)):
            names.update(str(s) for s in free_unbacked_symbols(v) if str(s).startswith("u"))
    return names


def makes_size(node: torch.fx.Node) -> bool:
    """True if ``node`` makes a data-dependent size its inputs do not carry."""
    made = _unbacked_int_names(node.meta.get("val"))
    if not made:
        return False
    known: set[str] = set()
    for arg in _depends_on(node):
        known |= _unbacked_int_names(arg.meta.get("val"))
    return bool(made - known)


def runs_on_host(node: torch.fx.Node) -> bool:
    """A node of a host step: one that makes a data-dependent size, or a Python-number
    node (size arithmetic, comparisons, runtime asserts) over such sizes."""
    if makes_size(node):
        return True
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return False
    values = [val, *(a.meta.get("val") for a in node.all_input_nodes)]
    return any(_unbacked_int_names(v) for v in values)


def _depends_on(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes ``node`` takes: its arguments, and the readbacks of its output's sizes
    (:data:`simaccel.count_sizes.SIZE_INPUTS`)."""
    return [*node.all_input_nodes, *size_inputs(node)]


def has_data_dependent_sizes(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and makes_size(n) for n in gm.graph.nodes)


def split_stages(gm: torch.fx.GraphModule) -> list[Stage]:
    """The graph's call nodes as alternating device and host stages (level 0 device,
    level 0 host, level 1 device...): a device node goes one level past the host steps it
    depends on, a host node to the level of its inputs, so each node runs as early as its
    inputs allow."""
    level: dict[torch.fx.Node, int] = {}
    host: dict[torch.fx.Node, bool] = {}
    stages: dict[tuple[int, bool], Stage] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        # an element of a host op's result (``_unique2``'s values) stays on the host
        on_host = runs_on_host(node) or (node.target is operator.getitem
                                         and host.get(node.args[0], False))
        deps = [level[a] + (1 if host[a] and not on_host else 0)
                for a in _depends_on(node) if a in level]
        level[node], host[node] = max(deps, default=0), on_host
        key = (level[node], on_host)
        stages.setdefault(key, Stage(not on_host, level[node])).nodes.append(node)
    ordered = [stages[k] for k in sorted(stages, key=lambda k: (k[0], k[1]))]
    _link(gm, ordered)
    return ordered


def _link(gm: torch.fx.GraphModule, stages: list[Stage]) -> None:
    """Fill each stage's inputs (values made outside it) and outputs (values used outside
    it, or returned by the graph)."""
    owner = {node: stage for stage in stages for node in stage.nodes}
    returned = set(_output_node(gm).all_input_nodes)
    for stage in stages:
        inside = set(stage.nodes)
        stage.inputs = list(dict.fromkeys(
            a for n in stage.nodes for a in _depends_on(n)
            if a not in inside and a.op != "get_attr"))
        stage.outputs = [n for n in stage.nodes
                         if n in returned or any(owner.get(u) is not stage for u in n.users)]


def _output_node(gm: torch.fx.GraphModule) -> torch.fx.Node:
    return next(n for n in reversed(gm.graph.nodes) if n.op == "output")


def stage_module(gm: torch.fx.GraphModule, stage: Stage) -> torch.fx.GraphModule:
    """A device stage as a graph of its own: a placeholder per input (its traced value
    kept), the nodes copied, its outputs returned as a tuple. Graph constants stay
    ``get_attr`` nodes of ``gm``."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in stage.inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node in stage.nodes:
        for arg in node.all_input_nodes:
            if arg not in env and arg.op == "get_attr":
                env[arg] = graph.node_copy(arg)
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(tuple(env[n] for n in stage.outputs))
    return torch.fx.GraphModule(gm, graph)


@dataclass
class CompiledStage:
    """A stage ready to run: ``run(values) -> outputs`` (a device stage's compiled graph
    in the boxed convention; None for a host stage, whose nodes run in order)."""

    stage: Stage
    run: Callable[[list[Any]], list[Any]] | None


class StagedGraph:
    """The callable a graph with data-dependent sizes becomes (boxed calling convention,
    like :class:`simaccel.compiled.CompiledGraph`)."""

    _boxed_call = True
    #: inputs that may arrive as Python numbers (CompiledGraph.bank_inputs): none, since
    #: host steps between the stages may read any input as a tensor
    bank_inputs: frozenset[int] = frozenset()

    def __init__(self, gm: torch.fx.GraphModule, stages: Sequence[CompiledStage],
                 report: Any, host_ops: int, readbacks: int):
        self.stages = list(stages)
        self.report = report
        self._placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self._constants = {n: _attr(gm, n.target) for n in gm.graph.nodes
                           if n.op == "get_attr"}
        self._returned = _output_node(gm).args[0]
        #: per call: host fallback ops and readbacks its host steps run
        self._host_ops, self._readbacks = host_ops, readbacks

    def __call__(self, args: list[Any]) -> list[Any]:
        env: dict[torch.fx.Node, Any] = dict(zip(self._placeholders, args))
        env.update(self._constants)
        args.clear()
        for compiled in self.stages:
            stage = compiled.stage
            if compiled.run is None:
                _run_host(stage.nodes, env)
            else:
                results = compiled.run([env[n] for n in stage.inputs])
                env.update(zip(stage.outputs, results))
        device = get_device()
        if self._host_ops:
            device.count("host_fallback_ops", self._host_ops)
        if self._readbacks:
            device.count("size_readbacks", self._readbacks)
        return list(torch.fx.node.map_arg(self._returned, env.__getitem__))

    def call_unboxed(self, *args: Any) -> list[Any]:
        return self(list(args))


def _run_host(nodes: Sequence[torch.fx.Node], env: dict[torch.fx.Node, Any]) -> None:
    """Run a host stage's nodes on real values, in graph order."""
    for node in nodes:
        args = torch.fx.node.map_arg(node.args, env.__getitem__)
        kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
        env[node] = node.target(*args, **kwargs)


def _attr(gm: torch.fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


#: compiles one device stage: (stage graph, its example inputs, their facts) -> callable
StageCompiler = Callable[[torch.fx.GraphModule, list[Any], list[Any]], Callable[..., Any]]


def compile_staged(gm: torch.fx.GraphModule, facts: Sequence[Any], compile_stage: StageCompiler,
                   name: str, fallback: str) -> StagedGraph:
    """Split ``gm`` (:func:`split_stages`), compile each device stage with
    ``compile_stage`` and report the host steps. ``facts``: the graph inputs'
    :class:`~simaccel.input_plan.InputFacts`, passed on to the stages that take them;
    ``fallback``: the backend's option (``"error"``: a host op raises instead)."""
    position = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    count_on_device(gm)
    stages = split_stages(gm)
    made_on_host = [n for s in stages if not s.on_device for n in s.nodes if makes_size(n)]
    host_ops = [(n.name, _host_reason(n)) for n in made_on_host
                if n.target not in READBACK_OPS]
    if host_ops and fallback == "error":
        raise UnsupportedOpError(host_ops[0][0], host_ops[0][1])
    compiled = []
    for stage in stages:
        if not stage.on_device:
            compiled.append(CompiledStage(stage, None))
            continue
        stage_facts = [facts[position[n]] if position.get(n, len(facts)) < len(facts)
                       else InputFacts() for n in stage.inputs]
        run = compile_stage(stage_module(gm, stage), [n.meta["val"] for n in stage.inputs],
                            stage_facts)
        compiled.append(CompiledStage(stage, run))
    report = CompileReport(graph=name, host_fallbacks=host_ops,
                           ops=sum(1 for n in gm.graph.nodes if n.op == "call_function"),
                           stages=[_describe(s) for s in stages])
    add_report(report)
    return StagedGraph(gm, compiled, report, len(host_ops),
                       len(made_on_host) - len(host_ops))


def _host_reason(node: torch.fx.Node) -> str:
    sizes = ", ".join(sorted(_unbacked_int_names(node.meta.get("val"))))
    return (f"{node.target}: its output size ({sizes}) is data-dependent and no device "
            f"kernel computes it; it runs on the host between two device stages")


def _describe(stage: Stage) -> str:
    side = "device" if stage.on_device else "host"
    names = ", ".join(n.name for n in stage.nodes[:6]) + (", ..." if len(stage.nodes) > 6 else "")
    return f"{side} stage {stage.level}: {len(stage.nodes)} ops ({names})"

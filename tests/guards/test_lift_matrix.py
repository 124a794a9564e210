"""The recompile matrix: every place a scalar lives x dynamic in {None, False, True}.

Dynamo's own ``eager`` backend recompiles when the scalar changes; with scalar lifting the
frame compiles once (the re-trace happens inside that first compile) and every call still
equals eager.
"""
from __future__ import annotations

import pytest
import torch

from conftest import LiftingBackend, unique_graphs
from scalar_cases import CASES, Case

DYNAMIC_MODES = (None, False, True)

# Graphs Dynamo's eager backend compiles for the 6 values of each case, per dynamic mode.
EAGER_GRAPHS = {
    "int_global": (6, 6, 6),
    "module_int_attr": (6, 6, 6),
}
DEFAULT_EAGER_GRAPHS = (2, 6, 1)


def _run(case: Case, backend, dynamic):
    fn, args_for = case.build()
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for value in case.values:
        args = args_for(value)
        expected = fn(*args)
        torch.testing.assert_close(compiled(*args), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dynamic", DYNAMIC_MODES, ids=lambda d: f"dynamic={d}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_eager_backend_recompiles(case: Case, dynamic) -> None:
    """The baseline lifting removes: Dynamo alone recompiles on a new scalar value."""
    _run(case, "eager", dynamic)
    graphs = EAGER_GRAPHS.get(case.name, DEFAULT_EAGER_GRAPHS)
    assert unique_graphs() == graphs[DYNAMIC_MODES.index(dynamic)]


@pytest.mark.parametrize("dynamic", DYNAMIC_MODES, ids=lambda d: f"dynamic={d}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_lifting_compiles_once(case: Case, dynamic) -> None:
    backend = LiftingBackend()
    _run(case, backend, dynamic)
    assert unique_graphs() == 1
    report = backend.reports[-1]
    lifted = {s.source: s for s in report.lifted}
    assert case.source in lifted, str(report)
    assert lifted[case.source].where.startswith(case.where.split()[0])
    assert case.source not in report.kept_sources


@pytest.mark.parametrize("dynamic", DYNAMIC_MODES, ids=lambda d: f"dynamic={d}")
def test_tensor_shapes_stay_static_unless_dynamic_true(dynamic) -> None:
    backend = LiftingBackend()
    _run(CASES[0], backend, dynamic)
    gm = backend.graphs[-1]
    sizes = [n.meta["example_value"].shape for n in gm.graph.nodes
             if n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.Tensor)
             and n.meta["example_value"].dim() > 0]
    symbolic = any(not isinstance(d, int) for shape in sizes for d in shape)
    assert symbolic == (dynamic is True)

"""The package's shape, as DESIGN.md states it: no import circle anywhere under
``simaccel/`` (imports inside functions count too), the layer order holds, only the
``simaccel.guards.dynamo`` package imports Dynamo's private modules, and no file is
over 500 lines."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "simaccel"
MAX_LINES = 500

#: layer of each top-level part (lower layers never import higher ones)
LAYERS = {"errors": 0, "cachedir": 0, "dma": 1, "runtime": 2, "codegen": 3, "guards": 3,
          "options": 3, "report": 3, "attention": 4, "layer_norm": 4, "pre_aot": 4, "input_plan": 4, "compiled": 4, "backend": 4,
          "distributed": 4, "bench": 5, "cli": 5, "demo": 5, "examples": 5}
#: torch modules whose internals only simaccel.guards.dynamo may use
PRIVATE_TORCH = ("torch._dynamo", "torch._guards", "torch._functorch", "torch._logging",
                 "torch._subclasses", "torch._decomp", "torch._inductor")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """simaccel modules ``path`` imports (at any depth of the file), resolved to modules:
    ``from simaccel.codegen import lowering`` imports ``simaccel.codegen.lowering``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as a list of modules, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_circle_under_simaccel():
    circle = _cycle(_graph())
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_lower_layers_never_import_higher_ones():
    wrong = [(m, dep) for m, deps in _graph().items() for dep in deps
             if _layer(m) is not None and _layer(dep) is not None and _layer(dep) > _layer(m)]
    assert not wrong, wrong


def test_only_the_dynamo_package_imports_torch_privates():
    offenders = []
    for name, path in _modules().items():
        # the bench, the demo and the examples measure Dynamo itself
        # (torch._dynamo.utils.counters, its config), as the tests do
        if name.startswith(("simaccel.guards.dynamo", "simaccel.bench", "simaccel.demo",
                            "simaccel.examples")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [(name, m) for m in mods if m.startswith(PRIVATE_TORCH)]
    assert not offenders, offenders


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_over_500_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path} has {lines} lines"

"""Kernels name the version of the helpers they are built from (:mod:`simaccel.codegen.
lib_version`), so a kernel cache filled by another simaccel never hands out a kernel
built with other helpers: the digest is in every kernel module's text, which both cache
layers key on; it covers every module a kernel's machine code comes from; and it
changes with any of them."""
from __future__ import annotations

import ast
import pathlib
import shutil

import torch

from simaccel.codegen import lib_version
from simaccel.codegen.lib_version import HELPER_FILES, HELPERS_DIGEST, helpers_digest
from tests.conftest import check

PACKAGE = pathlib.Path(lib_version.__file__).resolve().parents[1]


def _simaccel_imports(path: pathlib.Path) -> set[pathlib.Path]:
    """The simaccel modules ``path`` imports (``from simaccel.x import y``, ``from
    simaccel.x import y as z`` where y is a module, ``import simaccel.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("simaccel"):
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("simaccel")]
        for name in names:
            module = PACKAGE.parent.joinpath(*name.split(".")).with_suffix(".py")
            if module.exists():
                found.add(module)
    return found


def test_the_digest_covers_every_module_kernels_are_built_from():
    header_modules = {PACKAGE / "codegen" / "kernel_lib.py", PACKAGE / "codegen" / "size_lib.py"}
    todo, seen = list(header_modules), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo += _simaccel_imports(path) - {PACKAGE / "errors.py"}  # messages only
    assert seen <= set(HELPER_FILES), sorted(str(p) for p in seen - set(HELPER_FILES))


def test_the_digest_changes_with_any_helper(tmp_path):
    copies = []
    for path in HELPER_FILES:
        copy = tmp_path / path.parent.name / path.name
        copy.parent.mkdir(exist_ok=True)
        shutil.copy(path, copy)
        copies.append(copy)
    assert helpers_digest(tuple(copies)) == HELPERS_DIGEST
    copies[-1].write_text(copies[-1].read_text() + "\n# changed\n")
    assert helpers_digest(tuple(copies)) != HELPERS_DIGEST


def test_every_kernel_module_names_the_digest():
    result = check(lambda x: (x.exp() + 1.0, x.sum(-1)), torch.randn(16, 32))
    paths = [k.path for r in result.reports for k in r.kernels]
    assert paths
    for path in paths:
        assert pathlib.Path(path).read_text().startswith(f"# kernel helpers {HELPERS_DIGEST}\n")

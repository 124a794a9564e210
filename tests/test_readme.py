"""The README opens with the two set-up commands, CI runs the second one verbatim, and
every Python snippet in it runs as written."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: seconds a snippet may take: each should finish in a few (imports and a cold compile
#: included); the limit only stops a hung one.
SNIPPET_TIMEOUT_S = 180


def _commands() -> list[str]:
    blocks = re.findall(r"```\n(.*?)\n```", README, re.S)
    return [b.strip() for b in blocks[:2]]


def _python_blocks() -> list[tuple[int, str]]:
    """Every ```python block: (line of its opening fence, its code)."""
    return [(README.count("\n", 0, m.start()) + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```$", README, re.S | re.M)]


def test_readme_opens_with_demo_and_test_commands():
    demo, tests = _commands()
    assert demo.startswith("python3 -m venv .venv") and demo.endswith("simaccel demo")
    assert "pip install" in tests and "pytest" in tests


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert _commands()[1] in ci.splitlines()


def test_readme_has_python_snippets():
    assert len(_python_blocks()) >= 3  # the first example, scalars, catching errors


@pytest.mark.parametrize("line,code", [pytest.param(line, code, id=f"line{line}")
                                       for line, code in _python_blocks()])
def test_python_snippet_runs_as_written(line: int, code: str, tmp_path: Path):
    """A fresh interpreter in an empty folder with an empty kernel cache, as a new user."""
    env = {**os.environ, "SIMACCEL_CACHE_DIR": str(tmp_path / "kernels"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    work = tmp_path / "cwd"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, text=True,
                          capture_output=True, timeout=SNIPPET_TIMEOUT_S)
    assert proc.returncode == 0, (
        f"README.md snippet at line {line} failed (exit {proc.returncode}):\n{code}\n"
        f"--- stderr ---\n{proc.stderr[-3000:]}")

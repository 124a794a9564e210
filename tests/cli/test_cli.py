"""The ``simaccel`` command line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _simaccel(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simaccel.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=os.environ.copy())


def test_demo_runs_and_writes_a_trace(tmp_path):
    trace = tmp_path / "trace.json"
    proc = _simaccel("demo", "--steps", "4", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "simaccel" in proc.stdout and "tokens == eager" in proc.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)


@pytest.mark.parametrize("args,needle", [
    (["frobnicate"], "invalid choice"),
    (["demo", "--trace", "/nonexistent-dir/x.json"], "not a writable directory"),
])
def test_cli_errors_are_one_line_and_exit_2(args, needle):
    proc = _simaccel(*args, timeout=60)
    assert proc.returncode == 2
    assert needle in proc.stderr

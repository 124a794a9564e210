"""The ``simaccel`` command line."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from simaccel.cli import build_parser, plain_text


def _simaccel(*args: str, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simaccel.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})


def _row(stdout: str, label: str) -> list[str]:
    """The cells after ``label`` in the demo's table row of that name."""
    lines = stdout.splitlines()
    table = lines[next(i for i, ln in enumerate(lines) if ln.startswith("run ")):]
    line = next(ln for ln in table if ln.startswith(label + " "))
    return line[len(label):].split()


def test_demo_runs_and_writes_a_trace(tmp_path):
    """One run (the demo spawns two child processes): the table's rows, the cold and warm
    first calls, and the trace. With a user's default compile workers (the test session
    compiles serially), so the cold call runs tier 0."""
    trace = tmp_path / "trace.json"
    proc = _simaccel("demo", "--steps", "4", "--trace", str(trace), timeout=900,
                     SIMACCEL_COMPILE_WORKERS="2", SIMACCEL_TIER0="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "tokens == plain eager" in out
    plain = _row(out, "plain eager")
    assert plain[:2] == ["-", "-"] and plain[3] == "(reference)"
    graphs, recompiles, _, same = _row(out, "Dynamo eager backend")
    assert (graphs, recompiles, same) == ("4", "3", "True")  # a new temperature each step
    graphs, recompiles, _, same = _row(out, "simaccel")
    assert (graphs, recompiles, same) == ("1", "0", "True")
    _check_cold_and_warm(out)
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)


def _check_cold_and_warm(out: str) -> None:
    counts = (r" +([\d.]+) s  \({}: (\d+) kernels ran as numpy \(tier 0\) while numba compiled "
              r"them in the background, (\d+) compiled before the call, (\d+) loaded from "
              r"disk\)$")
    cold = re.search("^  cold" + counts.format("empty kernel cache"), out, re.M)
    warm = re.search("^  warm" + counts.format("same cache dir"), out, re.M)
    assert cold and warm, out
    # cold: every kernel started in tier 0, none waited for numba, none was on disk
    assert int(cold[2]) > 0 and int(cold[3]) == 0 and int(cold[4]) == 0
    # warm: the cold process finished its compiles before it exited (nothing compiled
    # before the call, none left out below); a kernel that runs in numba's thread pool
    # (the fused attention) has no native object, so it runs tier 0 while numba loads it
    assert int(warm[2]) <= 1 and int(warm[3]) == 0 and int(warm[4]) > 0
    assert "cold runs each new kernel's numpy form at once" in out
    # the table's simaccel run used the warm cache too
    assert "kernels compiled 0, loaded from disk cache" in out


@pytest.mark.parametrize("args,needle", [
    (["frobnicate"], "invalid choice"),
    (["demo", "--trace", "/nonexistent-dir/x.json"], "not a writable directory"),
    (["demo", "--steps", "-3"], "argument --steps: expected a positive integer, got '-3'"),
    (["demo", "--steps", "0"], "argument --steps: expected a positive integer, got '0'"),
])
def test_cli_errors_are_one_line_and_exit_2(args, needle, run_cli):
    status, stderr = run_cli(*args)
    assert status == 2, stderr[-2000:]
    assert needle in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


@pytest.mark.parametrize("argv", [[], ["demo"], ["bench"]], ids=["simaccel", "demo", "bench"])
def test_help_has_no_rest_markup(argv, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*argv, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "usage: simaccel" in text and "``" not in text and ":func:`" not in text


def test_plain_text_strips_literals_and_roles():
    assert plain_text("The ``simaccel`` command: :func:`~simaccel.demo.run_demo` runs") == \
        "The simaccel command: simaccel.demo.run_demo runs"
    assert "The simaccel command: simaccel demo and simaccel bench." in \
        build_parser().format_help()

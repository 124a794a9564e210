"""simaccel in torch's logging (issue 18): ``TORCH_LOGS="+simaccel"`` and
``torch._logging.set_logs`` show simaccel's log, and a recompile caused by a guard simaccel
added (a user's ``simaccel.Guard``, the device guards) names that guard in its reason, as
``TORCH_LOGS=recompiles`` prints it."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch
from torch._dynamo.utils import guard_failures

import simaccel
from conftest import unique_graphs
from simaccel.guards.device import ALIGNED, DEVICE_CONFIG, INT_SLOT

_ROOT = str(pathlib.Path(__file__).resolve().parents[2])

#: a DEBUG record of a simaccel module in torch's format: "V1201 11:29:07.091000 123
#: simaccel/backend.py:108] [0/0] ..."
SIMACCEL_DEBUG_LINE = re.compile(r"^V\d{4} [\d:.]+ +\d+ \S*simaccel/\S+\.py:\d+\]", re.M)

PROGRAM = textwrap.dedent("""
    import torch, simaccel

    def scaled(x, n):
        return x * n + 1

    guard = simaccel.Guard("L['n']", lambda n: n < 10, "my_guard")
    compiled = torch.compile(scaled, backend="simaccel", options={"guards": [guard]})
    for n in (5, 20):
        assert torch.equal(compiled(torch.ones(4), n), scaled(torch.ones(4), n))
""")


def run_python(program: str, cache_dir: pathlib.Path, **env: str) -> str:
    """Run ``program`` in a new interpreter; returns its stderr (asserts it succeeded)."""
    environ = {key: value for key, value in os.environ.items() if key != "TORCH_LOGS"}
    environ.update(SIMACCEL_CACHE_DIR=str(cache_dir),
                   PYTHONPATH=os.pathsep.join([_ROOT, environ.get("PYTHONPATH", "")]), **env)
    proc = subprocess.run([sys.executable, "-c", program], env=environ, cwd=_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def test_torch_logs_env_shows_simaccel_debug_and_named_recompile_reasons(tmp_path) -> None:
    err = run_python(PROGRAM, tmp_path, TORCH_LOGS="+simaccel,recompiles")
    assert SIMACCEL_DEBUG_LINE.search(err), err[-3000:]
    reasons = err[err.index("Recompiling function scaled"):]
    assert "triggered by the following guard failure(s)" in reasons
    assert "my_guard: " in reasons.splitlines()[2], reasons[:1000]


def test_without_torch_logs_simaccel_debug_stays_quiet(tmp_path) -> None:
    err = run_python(PROGRAM, tmp_path)
    assert not SIMACCEL_DEBUG_LINE.search(err), err[-3000:]


def test_set_logs_shows_simaccel_debug(tmp_path) -> None:
    """After ``import simaccel`` the name is a registered torch log: ``set_logs`` resolves it
    without importing every simaccel subpackage to find it (as it does for an unknown
    module name)."""
    program = textwrap.dedent("""
        import logging, sys, torch, simaccel
        torch._logging.set_logs(modules={"simaccel": logging.DEBUG})
        assert "simaccel.bench" not in sys.modules, "set_logs walked simaccel's packages"
    """) + PROGRAM
    err = run_python(program, tmp_path)
    assert SIMACCEL_DEBUG_LINE.search(err), err[-3000:]


# ---------------------------------------------------------------- recompile reasons, in process

X = torch.linspace(-1.0, 1.0, 32)


def scaled(x: torch.Tensor, n: int) -> torch.Tensor:
    return x * n + 1


def _user_guard_flips(compiled: Callable) -> None:
    compiled(X, 5)
    compiled(X, 20)


def _int_leaves_its_slot(compiled: Callable) -> None:
    compiled(X, 5)
    compiled(X, 2 ** 40)


def _int_enters_its_slot(compiled: Callable) -> None:
    compiled(X, 2 ** 40)
    compiled(X, 5)


def _device_config_changes(compiled: Callable) -> None:
    compiled(X, 5)
    with simaccel.configure(dma_channels=2):
        compiled(X, 5)


def _input_misaligned(compiled: Callable) -> None:
    compiled(X, 5)
    odd = torch.linspace(-1.0, 1.0, 33)[1:]
    assert odd.data_ptr() % simaccel.get_device().config.alignment != 0
    compiled(odd, 5)


@pytest.mark.parametrize("name,calls", [
    ("my_guard", _user_guard_flips),
    (INT_SLOT, _int_leaves_its_slot),
    (INT_SLOT, _int_enters_its_slot),
    (DEVICE_CONFIG, _device_config_changes),
    (ALIGNED, _input_misaligned),
], ids=["user guard", "int past 32 bits", "int back in 32 bits", "device config",
        "misaligned input"])
def test_recompile_reason_names_the_simaccel_guard(name: str, calls: Callable) -> None:
    """The reason Dynamo records for the recompile (and ``TORCH_LOGS=recompiles`` prints)
    names the guard that failed, also for simaccel's int-slot range, which runs among
    Dynamo's own shape-env guards."""
    guard_failures.clear()
    guards = [simaccel.Guard("L['n']", lambda n: n < 10, "my_guard")] \
        if name == "my_guard" else []
    compiled = torch.compile(scaled, backend="simaccel", dynamic=False,
                             options={"guards": guards})
    calls(compiled)
    assert unique_graphs() == 2
    reasons = guard_failures[scaled.__code__]
    assert len(reasons) == 1 and name in reasons[0], reasons

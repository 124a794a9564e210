"""Collects the OpInfo sweep's per-op results from every test (also across xdist workers:
they travel in the test reports' ``user_properties``) and prints the sweep's table at
the end of the run: device / host / error counts and the host ops with their reasons.

The hooks are imported by ``tests/conftest.py``: under xdist only the controller prints
the summary, and it loads only the top-level conftest."""
from __future__ import annotations

import pytest

from tests.ops.sweep import OpResult, summary_table

_RESULTS: dict[str, list[OpResult]] = {}
_IMPROVED: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    for key, value in report.user_properties:
        if key == "opinfo_result":
            mode, fields = value
            _RESULTS.setdefault(mode, []).append(OpResult(**fields))
        elif key == "opinfo_improved":
            _IMPROVED.append(value)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for mode, results in sorted(_RESULTS.items()):
        terminalreporter.write_sep("=", f"OpInfo sweep: {mode}")
        terminalreporter.write_line(summary_table(results, mode))
    _half_ratio(terminalreporter)
    if _IMPROVED:
        terminalreporter.write_sep("=", "OpInfo: known host ops that now run on the device")
        for line in sorted(_IMPROVED):
            terminalreporter.write_line(f"  {line} (remove it from KNOWN_HOST_OPS)")


def _half_ratio(terminalreporter: pytest.TerminalReporter) -> None:
    """Of the ops fully on the device in float32, the share also on the device in bf16."""
    f32 = {r.name for r in _RESULTS.get("float32", []) if r.status == "device"}
    half = {r.name: r.status for r in _RESULTS.get("bfloat16", []) if r.name in f32}
    counted = {n: s for n, s in half.items() if s in ("device", "host", "error", "mismatch")}
    if counted:
        share = 100.0 * sum(s == "device" for s in counted.values()) / len(counted)
        terminalreporter.write_line(
            f"bfloat16: {share:.1f}% of the {len(counted)} ops on the device in float32 (and "
            f"swept in bfloat16) also run on the device in bfloat16")

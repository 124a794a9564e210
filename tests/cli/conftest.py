"""Run the ``simaccel`` command line in this process (argument errors need no child)."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from simaccel.cli import main


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str]]:
    """``run_cli(*args) -> (exit status, stderr)``, as ``python -m simaccel.cli`` ends."""
    def run(*args: str) -> tuple[int, str]:
        try:
            status = main(list(args))
        except SystemExit as exc:  # argparse's errors
            status = exc.code if isinstance(exc.code, int) else 1
        return status, capsys.readouterr().err
    return run

"""Running a program in a new interpreter with a kernel cache of the test's choosing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_child_program(program: str, cache_dir: Path, **env: str) -> dict:
    """Run ``program`` (Python source that prints a JSON object as its last line) in a new
    interpreter whose kernel cache is ``cache_dir``; returns that object."""
    environ = {**os.environ, "SIMACCEL_CACHE_DIR": str(cache_dir), **env}
    proc = subprocess.run([sys.executable, "-c", program], env=environ, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])

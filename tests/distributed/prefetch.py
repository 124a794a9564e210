"""The training job ``test_ddp.py``'s tests share, started in the background when the
session starts, so that no xdist worker sits idle waiting for it.

The session's first process (the xdist controller, or the one pytest process) starts
``python -m tests.distributed.prefetch PATH`` if the DDP tests are among the paths it was
given (:func:`start`); the child runs the 2-rank job while the workers run other tests,
and writes its results to ``PATH`` (atomically) or the error to ``PATH.err``. The module
fixture then only waits for the file (:func:`wait_for`); without a background job it
runs the job itself.
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from simaccel.examples.ddp_train import RunSpec

#: where the background job writes its results (set by the session's first process,
#: inherited by the xdist workers)
JOB_FILE_VAR = "SIMACCEL_TESTS_DDP_JOB"
STEPS = 6
SPECS = {
    "mlp/dynamo-eager": RunSpec("mlp", "eager", STEPS, compile_optimizer=True),
    "transformer/eager-ddp": RunSpec("transformer", "none", STEPS),
    "transformer/simaccel": RunSpec("transformer", "simaccel", STEPS),
    "transformer/dynamo-eager": RunSpec("transformer", "eager", STEPS),
    "mlp/simaccel-outside": RunSpec("mlp", "simaccel", 3, compile_outside=True),
    "mlp/dynamo-eager-outside": RunSpec("mlp", "eager", 3, compile_outside=True),
}
#: seconds the job may take on a loaded 2-core machine
TIMEOUT_S = 600
_HERE = Path(__file__).resolve().parent


def run_job() -> list[dict]:
    """Every rank's results of the job (:func:`tests.distributed.jobs.train_then_shutdown`)."""
    from simaccel.distributed import spawn
    from tests.distributed import jobs
    return spawn(jobs.train_then_shutdown, 2, (STEPS, list(SPECS.values())),
                 timeout_s=TIMEOUT_S - 200)


def selected(args: list[str], rootdir: Path) -> bool:
    """True if the session's path arguments include this folder's tests."""
    paths = [a.split("::")[0] for a in args if not a.startswith("-")] or ["."]
    for arg in paths:
        path = (rootdir / arg).resolve()
        if path == _HERE or _HERE in path.parents or path in _HERE.parents:
            return True
    return False


def start(session_root: Path) -> subprocess.Popen:
    """Start the job in the background; its results go to a file under ``session_root``."""
    path = session_root / "ddp_job.pkl"
    os.environ[JOB_FILE_VAR] = str(path)
    return subprocess.Popen([sys.executable, "-m", "tests.distributed.prefetch", str(path)],
                            cwd=_HERE.parents[1], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    """End the background job if it still runs, with the rank processes it started (its
    own process group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def wait_for() -> list[dict] | None:
    """The background job's results (waiting for them), or None if none was started."""
    name = os.environ.get(JOB_FILE_VAR)
    if not name:
        return None
    path, error = Path(name), Path(name + ".err")
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if path.exists():
            return pickle.loads(path.read_bytes())
        if error.exists():
            raise RuntimeError(f"the background DDP job failed:\n{error.read_text()}")
        time.sleep(0.2)
    raise TimeoutError(f"the background DDP job wrote no result in {TIMEOUT_S} s")


def _main(path: Path) -> None:
    try:
        result = run_job()
    except BaseException:  # noqa: BLE001 - the waiting fixture raises it
        Path(str(path) + ".err").write_text(traceback.format_exc())
        raise
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(result))
    tmp.replace(path)


if __name__ == "__main__":
    _main(Path(sys.argv[1]))

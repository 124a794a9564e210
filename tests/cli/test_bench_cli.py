"""``simaccel bench``: quick run writes JSON and PNG; command-line errors exit 2 in one line."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

#: one cheap scenario per group that the plot draws, plus the compile pair of simaccel.
QUICK_ARGS = ["bench", "--quick", "--backends", "eager,dynamo_eager,simaccel",
              "--scenarios", "steady,scalar/float_arg[dynamic=False],guard/3_scalars[default]"]


def _simaccel(*args: str, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simaccel.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})


def test_quick_bench_writes_json_and_png(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs the bench extra")
    out_json, out_png = tmp_path / "out.json", tmp_path / "out.png"
    proc = _simaccel(*QUICK_ARGS, "--json", str(out_json), "--plot", str(out_png))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "targets:" in proc.stdout and "[" in proc.stderr  # table on stdout, progress on stderr
    load = re.search(r"load average (\S+) -> (\S+)$", proc.stdout.splitlines()[0])
    assert load and all(re.fullmatch(r"None|\d+(\.\d{1,2})?", v) for v in load.groups()), \
        proc.stdout.splitlines()[0]  # rounded to 2 decimals
    data = json.loads(out_json.read_text())
    changed = data["results"]["simaccel"]["scalar/float_arg[dynamic=False]"]
    assert changed["recompiles"] == 0 and changed["median_s"] > 0
    assert changed["steady_median_s"] > 0
    assert data["results"]["dynamo_eager"]["scalar/float_arg[dynamic=False]"]["recompiles"] > 0
    assert data["results"]["simaccel"]["steady/tiny_x*2+1_16"]["ratio_baseline"] == "dynamo_eager"
    lifted = data["results"]["simaccel"]["guard/3_scalars[default]"]
    assert lifted["guard_check_same_rounds_s"] > 0 and lifted["call_off_same_rounds_s"] > 0
    assert {t["name"] for t in data["targets"]} and data["meta"]["quick"] is True
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,needle", [
    (["bench", "--backends", "eager,tpu"], "unknown backend(s) ['tpu']"),
    (["bench", "--json", "/nonexistent-dir/x.json"], "not a writable directory"),
    (["bench", "--plot", "/nonexistent-dir/x.png"], "not a writable directory"),
    (["bench", "--threads", "0"], "positive integer"),
    (["bench", "--scenarios", "no-such-scenario", "--backends", "eager"], "no scenario matches"),
])
def test_bench_errors_are_one_line_and_exit_2(args, needle, run_cli):
    status, stderr = run_cli(*args)
    assert status == 2, stderr[-2000:]
    assert needle in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


def test_plot_without_matplotlib_is_one_line_and_exit_2(tmp_path):
    """``matplotlib`` made unimportable: the run stops before measuring anything."""
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from simaccel.cli import main\n"
            f"sys.exit(main(['bench', '--quick', '--plot', {str(tmp_path / 'x.png')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == ("simaccel bench: error: --plot needs matplotlib: "
                                   "pip install 'simaccel[bench]'")
    assert not (tmp_path / "x.png").exists()


def test_a_quick_run_leaves_out_the_slow_baselines_unless_named(tmp_path):
    """``--quick`` (under a minute): no inductor or aot_eager by default, the scalar
    scenarios at Dynamo's default ``dynamic=None``; naming a scenario still runs it."""
    from simaccel.bench import runner
    from simaccel.bench.scenarios import BenchConfig
    cfg = BenchConfig.make(True)
    backends = runner.default_backends(True)
    assert "inductor" not in backends and "aot_eager" not in backends
    assert "simaccel" in backends and "dynamo_eager" in backends
    chosen = runner.select(runner.build_tasks(backends, cfg, str(tmp_path)), None)
    scalar = [t for t in chosen if t.group == "scalar"]
    assert scalar and all("dynamic=None" in t.scenario for t in scalar)
    named = runner.select(runner.build_tasks(backends, cfg, str(tmp_path)),
                          ["scalar/float_arg[dynamic=False]"])
    assert {t.backend for t in named} == set(backends)

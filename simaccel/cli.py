"""The ``simaccel`` command: ``simaccel demo`` and ``simaccel bench``.

Errors in the command line (unknown subcommand, unwritable path) print one clear
line and exit with status 2.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Sequence

#: where ``simaccel demo`` writes its Chrome trace by default (in the current directory).
DEMO_TRACE_FILE = "simaccel_demo_trace.json"
DDP_TRACE_FILE = "simaccel_ddp_trace.json"


def _writable_path(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"cannot write {path}: it is a directory")
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {path}: {folder} is not a writable directory")
    return path


_RST_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_RST_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(text: str) -> str:
    """``text`` without reST markup: ``simaccel`` and :func:`run` become simaccel and run
    (help text is taken from docstrings, but a terminal shows it as it is)."""
    return _RST_LITERAL.sub(r"\1", _RST_ROLE.sub(r"\1", text))


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage block) and exit status 2,
    and whose help has no reST markup."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")

    def format_help(self) -> str:
        return plain_text(super().format_help())


def _backend_list(text: str) -> list[str]:
    from simaccel.bench import BACKENDS
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown backend(s) {unknown or [text]}; choose from {', '.join(BACKENDS)}")
    return names


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="recompile latency, steady call, compile time, "
                           "kernel throughput and guard overhead of every backend in one run")
    bench.add_argument("--quick", action="store_true",
                       help="tiny kernel sizes, fewer samples, no inductor or aot_eager, "
                       "the scalar scenarios at dynamic=None only; of the compile "
                       "benchmarks only simaccel's cold and warm compile; no sort or topk kernels "
                       "and no Dynamo eager kernel rows unless --scenarios names them "
                       "(about a minute)")
    bench.add_argument("--backends", type=_backend_list, default=None,
                       help="comma-separated backends (default: eager, dynamo_eager, aot_eager, "
                       "inductor, simaccel; inductor and aot_eager left out with --quick)")
    bench.add_argument("--scenarios", default=None,
                       help="comma-separated substrings of scenario ids, e.g. "
                       "'steady,scalar/float_arg,compile' (default: all)")
    bench.add_argument("--threads", type=_positive_int, default=None, metavar="N",
                       help="compute threads for torch and numba (default: their defaults)")
    bench.add_argument("--json", type=_writable_path, default=None, metavar="PATH",
                       help="write every figure (seconds) and the targets as JSON")
    bench.add_argument("--plot", type=_writable_path, default=None, metavar="PATH",
                       help="write a PNG (needs matplotlib: pip install 'simaccel[bench]')")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="simaccel", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="generate tokens with a small transformer LM whose "
                          "sampling temperature and logit scale change every step")
    demo.add_argument("--steps", type=_positive_int, default=None, metavar="N",
                      help="tokens to generate (default 12); with --ddp, training steps "
                      "(default 10)")
    demo.add_argument("--trace", type=_writable_path, default=None, metavar="PATH",
                      help=f"Chrome trace of the simulated device (default {DEMO_TRACE_FILE}; "
                      f"with --ddp {DDP_TRACE_FILE})")
    demo.add_argument("--ddp", action="store_true",
                      help="data-parallel training instead: 2 ranks (gloo on 127.0.0.1), a "
                      "simulated device each; under torchrun, runs as torchrun's rank")
    _add_bench_parser(sub)
    return parser


def _bench(args: argparse.Namespace) -> int:
    from simaccel.bench.command import run_bench_command
    return run_bench_command(quick=args.quick, backends=args.backends,
                             scenarios=args.scenarios, json_path=args.json, plot_path=args.plot,
                             threads=args.threads)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo" and args.ddp:
        from simaccel.examples.ddp_demo import run_ddp_demo
        return run_ddp_demo(args.trace or DDP_TRACE_FILE,
                            steps=args.steps or 10)
    if args.command == "demo":
        from simaccel.demo import run_demo
        return run_demo(steps=args.steps or 12, trace_path=args.trace or DEMO_TRACE_FILE)
    if args.command == "bench":
        return _bench(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())

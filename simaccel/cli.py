"""The ``simaccel`` command: ``simaccel demo``.

Errors in the command line (unknown subcommand, unwritable path) print one clear
line and exit with status 2.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence


def _writable_path(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {path}: {folder} is not a writable directory")
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simaccel", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="generate tokens with a small transformer LM whose "
                          "sampling temperature and logit scale change every step")
    demo.add_argument("--steps", type=int, default=12, help="tokens to generate (default 12)")
    demo.add_argument("--trace", type=_writable_path, default="simaccel_demo_trace.json",
                      help="Chrome trace of the simulated device (default %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from simaccel.demo import run_demo
        return run_demo(steps=args.steps, trace_path=args.trace)
    return 2


if __name__ == "__main__":
    sys.exit(main())

"""Run the OpInfo sweep outside pytest and write the per-op results as JSON:

    python -m tests.ops.run_sweep --dtype float32 [--backward] [--limit 1] [--shard 0/2]
        [--ops NAME ...] [--json out.json]

(the tests in ``test_opinfo.py`` run the same engine; this is for looking at one op or
a long sweep without pytest's capture).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

import torch

from tests.ops.sweep import op_name, run_op, summary_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--limit", type=int, default=1, help="samples per op")
    parser.add_argument("--shard", default="0/1", help="k/n: every n-th op from the k-th")
    parser.add_argument("--ops", nargs="*", default=None, help="OpInfo names to run")
    parser.add_argument("--json", default=None)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    from torch.testing._internal.common_methods_invocations import op_db
    dtype = getattr(torch, args.dtype)
    k, n = (int(x) for x in args.shard.split("/"))
    ops = [op for i, op in enumerate(op_db) if i % n == k]
    if args.ops:
        ops = [op for op in ops if op_name(op) in args.ops or op.name in args.ops]
    results = []
    for op in ops:
        result = run_op(op, dtype, args.backward, args.limit)
        results.append(result)
        if args.verbose:
            print(f"{result.status:12s} {result.seconds:6.1f}s {result.name} "
                  f"{result.fallbacks[:2]} {result.detail[:200]}", flush=True)
    print(summary_table(results, f"{args.dtype}{' + backward' if args.backward else ''}"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`lamina check`: run every invariant check on lamina's own modules."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="run lamina's invariant checks (PASS/FAIL per check)",
        description="Run every invariant check of lamina.checks on lamina's own modules and "
        "print one PASS/FAIL line each. Exit status 1 if any check fails.",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed for the probes (default: 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lamina.checks import run_all

    results = run_all(seed=args.seed)
    for r in results:
        line = f"{'PASS' if r.ok else 'FAIL'}  {r.name}"
        print(line if r.ok else f"{line}: {r.message}")
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed}/{len(results)} checks passed")
    return 1 if failed else 0

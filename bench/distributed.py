"""Tokens/s of `lamina train` in 1 and N processes (DDP, optionally FSDP) at a given shape.

    .venv/bin/python bench/distributed.py [--preset baby] [--steps 6] [--nproc 2] [--fsdp]

Each configuration is a real `lamina train` run (N > 1 through `--nproc`, i.e. torchrun) on
a synthetic corpus, with the same global batch; tokens/s is read from the run's metrics.jsonl
over the steps after the first (which pays for warm-up), so process start-up is not counted.
On a machine with fewer cores than processes x threads the processes share cores: the
figure then shows the communication overhead, not a speed-up. The load average is printed
because a shared machine makes these numbers noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run(corpus: Path, out: Path, nproc: int, fsdp: bool, args: argparse.Namespace) -> float:
    cmd = [sys.executable, "-m", "lamina", "train", "--data", str(corpus), "--out", str(out),
           "--preset", args.preset, "--batch-size", str(args.batch_size), "--micro-batch-size",
           str(args.micro_batch_size), "--max-steps", str(args.steps), "--eval-every",
           str(args.steps), "--eval-batches", "1", "--log-every", "1", "--dtype", "fp32",
           "--device", "cpu", "--quiet", "--warmup", "1"]  # fmt: skip
    if nproc > 1:
        cmd += ["--nproc", str(nproc)] + (["--fsdp"] if fsdp else [])
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tok_per_s"] for r in recs if "tok_per_s" in r and r["step"] > 1]
    return sum(rates) / len(rates)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="baby")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--fsdp", action="store_true", help="also time FSDP2")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("".join(chr(97 + (i * 7919) % 26) for i in range(400_000)))
        rows = [("1 process", 1, False), (f"{args.nproc} processes, DDP", args.nproc, False)]
        if args.fsdp:
            rows.append((f"{args.nproc} processes, FSDP2", args.nproc, True))
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        print(f"| {args.preset}, batch {args.batch_size}, {args.steps} steps | tokens/s | ratio |")
        print("|---|---:|---:|")
        base = None
        for i, (name, n, fsdp) in enumerate(rows):
            rate = run(corpus, Path(tmp) / f"r{i}", n, fsdp, args)
            base = base or rate
            print(f"| {name} | {rate:,.0f} | {rate / base:.2f} |", flush=True)
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

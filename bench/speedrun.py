"""Speedrun: lamina's defaults against nanoGPT's CPU recipe, in the same wall time.

    .venv/bin/python bench/speedrun.py [--data PATH] [--budget SECONDS] [--out DIR]

(a) lamina configured as nanoGPT's README CPU recipe (4 layers, 4 heads, 128 wide, block 64,
    batch 12, AdamW lr 1e-3, 100 warmup steps, 2,000 steps, cosine to 1e-4, no dropout, no
    biases, GPT-2 layers) is trained and timed, start to end of the command;
(b) `lamina train --max-time T` with no other flag, T = (a)'s wall time (or --budget).
Both are then scored by `lamina eval` over the whole validation text (the last 10% of the
characters), in nats per character. They run one after the other in this script, on the same
machine, so the comparison is fair even where absolute speed is not. The data defaults to the
shared tinyshakespeare (LAMINA_SHARED_DATA, default ../shared/data); the script says which CPU
it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from machine import cpu_line as cpu  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NANOGPT = [
    "--n-layers", "4", "--n-heads", "4", "--d-model", "128", "--block-size", "64",
    "--batch-size", "12", "--optimizer", "adamw", "--lr", "1e-3", "--warmup", "100",
    "--max-steps", "2000", "--decay", "cosine", "--min-lr-ratio", "0.1", "--dropout", "0",
    "--no-bias", "--weight-decay", "0.1", "--grad-clip", "1", "--eval-every", "250",
    "--eval-batches", "20", "--tokenizer", "char",
]  # fmt: skip


def lamina(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lamina", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def train(name: str, data: str, out: Path, flags: list[str]) -> dict:
    run = out / name
    start = time.perf_counter()
    done = lamina("train", "--data", data, "--out", str(run), "--force", "--quiet", *flags)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name}: lamina train failed:\n{done.stderr[-2000:]}")
    scored = lamina("eval", str(run), "--json")
    if scored.returncode != 0:
        raise SystemExit(f"{name}: lamina eval failed:\n{scored.stderr[-2000:]}")
    result = json.loads(scored.stdout)
    state = json.loads((run / "trainer_state.json").read_text())
    recipe = json.loads((run / "train_config.json").read_text())["train"]
    return {
        "name": name,
        "wall": wall,
        "steps": state["step"],
        "tokens": state["tokens_seen"],
        "loss": result.get("loss_per_char", result["loss"]),
        "recipe": {k: recipe.get(k) for k in ("optimizer", "batch_size", "lr", "tokenizer")},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared = Path(os.environ.get("LAMINA_SHARED_DATA", ROOT.parent / "shared" / "data"))
    p.add_argument("--data", default=str(shared / "tinyshakespeare.txt"))
    p.add_argument("--budget", type=float, default=None, help="(b)'s seconds (default: (a)'s)")
    p.add_argument("--out", default="/tmp/lamina-speedrun", help="where the two runs go")
    args = p.parse_args()
    if not Path(args.data).is_file():
        raise SystemExit(f"no data at {args.data} (set LAMINA_SHARED_DATA or pass --data)")
    out = Path(args.out)
    print(f"machine: {cpu()}")
    a = train("nanogpt-recipe", args.data, out, NANOGPT)
    budget = args.budget or a["wall"]
    b = train("lamina-defaults", args.data, out, ["--max-time", f"{budget:.0f}s"])
    print("| run | wall s | steps | tokens | val nats/char | recipe |")
    print("|---|---:|---:|---:|---:|---|")
    for r in (a, b):
        print(
            f"| {r['name']} | {r['wall']:.0f} | {r['steps']} | {r['tokens']:,} | "
            f"{r['loss']:.4f} | {r['recipe']} |"
        )
    print(f"lamina's defaults: {b['loss']:.4f} vs {a['loss']:.4f} in {budget:.0f} s")


if __name__ == "__main__":
    main()

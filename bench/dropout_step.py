"""What dropout costs a training step at the speedrun's BPE shape (issue 36's long budgets).

    python bench/dropout_step.py [--rounds 8] [--steps 4]

lamina's GPT as the budget's BPE rows train it: 3 layers x 128 wide, 4 heads, rotary
positions, a 1,536-token vocabulary, batch 48 x 64 tokens, Muon (bf16 Newton-Schulz where bf16
is native) at lr 1e-2 and weight decay 0.6, bf16 autocast as `--dtype auto` picks, clip 1.0 (the
step of bench/step.py). Variants: no dropout; dropout 0.1 everywhere (attention weights too,
which takes SDPA off its fused CPU kernel); dropout 0.1 with `attn_dropout` 0 (embedding,
residual and feed-forward dropout only). The variants take turns, rotated per round (the first
round is warm-up, not counted); the median step of each is reported, with its ratio to no
dropout. Load from other processes hits all alike; compare only ratios from one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from contextlib import nullcontext

import torch
from machine import cpu_line  # noqa: E402
from step import bf16_autocast, full_loss, stepper  # noqa: E402

from lamina import GPT, GPTConfig
from lamina.cpu import native_bf16
from lamina.training.device import use_bf16
from lamina.training.optim import build_optimizer

VOCAB, BLOCK, BATCH = 1536, 64, 48
VARIANTS = {
    "no dropout": {},
    "dropout 0.1": {"dropout": 0.1},
    "dropout 0.1, attn_dropout 0": {"dropout": 0.1, "attn_dropout": 0.0},
}


def build(fields: dict):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=BLOCK, d_model=128, n_heads=4, n_layers=3,
                    positions="rope", **fields)  # fmt: skip
    model = GPT(cfg).train()
    opt = build_optimizer(model, lr=1e-2, weight_decay=0.6, optimizer="muon",
                          ns_dtype="bf16" if native_bf16() else "fp32")  # fmt: skip
    amp = use_bf16("auto", torch.device("cpu"), cfg.d_model)
    return stepper(model, full_loss, opt, bf16_autocast if amp else nullcontext)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8, help="rounds (the first is warm-up)")
    p.add_argument("--steps", type=int, default=4, help="steps per variant per round")
    args = p.parse_args()
    print(f"machine: {cpu_line()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (BATCH, BLOCK), generator=g)
    y = torch.randint(0, VOCAB, (BATCH, BLOCK), generator=g)
    steps = {name: build(fields) for name, fields in VARIANTS.items()}
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            for _ in range(args.steps):
                t0 = time.perf_counter()
                steps[name](x, y)
                if r:
                    times[name].append(time.perf_counter() - t0)
    base = statistics.median(times[names[0]])
    print(f"load {os.getloadavg()[0]:.1f}")
    print("| variant | ms/step (median) | steps in the same time |")
    print("|---|---:|---:|")
    for name in names:
        med = statistics.median(times[name])
        print(f"| {name} | {med * 1000:.1f} | {base / med:.2f}x |")


if __name__ == "__main__":
    main()

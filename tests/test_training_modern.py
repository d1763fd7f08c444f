"""The modern layers under the existing training code: llama-tiny learns, FSDP agrees."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from lamina.training.config import TrainConfig
from lamina.training.loop import run_training
from lamina.training.session import new_session

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\n"
) * 60
MODEL = {"block_size": 16, "qk_norm": True, "zero_init_proj": True}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("data") / "corpus.txt"
    p.write_text(TEXT, encoding="utf-8")
    return str(p)


def config(corpus: str, steps: int, **model: object) -> TrainConfig:
    return TrainConfig(data=corpus, preset="llama-tiny", batch_size=8, micro_batch_size=2,
                       max_steps=steps, eval_every=steps, checkpoint_every=steps, log_every=1,
                       warmup=2, lr=3e-3, device="cpu", optimizer="adamw",
                       model_overrides={**MODEL, **model})  # fmt: skip


def test_llama_tiny_loss_falls(corpus, tmp_path):
    """RoPE + RMSNorm + SwiGLU + GQA (+ QK-norm, soft-cap, zero-init): loss falls in 12 steps."""
    cfg = config(corpus, 12, logit_softcap=30.0)
    losses = run_training(new_session(cfg, out=tmp_path / "r"), quiet=True).losses
    first, last = losses[1], min(losses[s] for s in range(10, 13))
    assert first > 3.0  # about ln(vocabulary of the text's characters) at the start
    assert last < first - 1.0, losses


def test_fsdp_llama_tiny_losses_equal_one_process(corpus, tmp_path):
    """Two FSDP2 processes (gloo, CPU) give the per-step losses of one process."""
    one = dataclasses.replace(config(corpus, 4), dtype="fp32")
    ref = run_training(new_session(one, out=tmp_path / "one"), quiet=True).losses
    flags = [
        "--preset",
        "llama-tiny",
        "--block-size",
        "16",
        "--qk-norm",
        "--zero-init-proj",
        "--batch-size",
        "8",
        "--micro-batch-size",
        "2",
        "--max-steps",
        "4",
        "--eval-every",
        "4",
        "--checkpoint-every",
        "4",
        "--log-every",
        "1",
        "--warmup",
        "2",
        "--lr",
        "3e-3",
        "--device",
        "cpu",
        "--quiet",
        "--optimizer",
        "adamw",
        "--dtype",
        "fp32",  # equality of the sharding, not of bf16 rounding (auto is bf16 at 128 on AMX)
    ]  # fmt: skip  (FSDP shards matrices: not Muon)
    run = tmp_path / "two"
    cmd = [sys.executable, "-m", "lamina", "train", "--data", corpus, "--out", str(run),
           "--nproc", "2", "--fsdp", *flags]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    got = {r["step"]: r["loss"] for r in recs if "loss" in r}
    assert sorted(got) == [1, 2, 3, 4]
    assert max(abs(got[s] - ref[s]) for s in got) <= 1e-5, (got, ref)

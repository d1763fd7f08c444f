"""Train a SequenceClassifier on a synthetic classification task (the encoder toy task).

The seed encoder's task: does the first token equal the last? Fresh batches are drawn every step
(the task is infinite), so there is no overfitting to watch; held-out accuracy is measured on
batches drawn from a separately seeded generator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lamina.data.tasks import first_last_batch
from lamina.errors import LaminaError
from lamina.models.config import EncoderConfig
from lamina.models.encoder import SequenceClassifier


@dataclass
class ClassifyResult:
    steps: int
    final_loss: float
    accuracy: float  # on held-out batches
    seconds: float


@torch.no_grad()
def accuracy(model: SequenceClassifier, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    was_training = model.training
    model.eval()
    correct = total = 0
    for ids, labels in batches:
        correct += int((model(ids).argmax(-1) == labels).sum())
        total += labels.numel()
    model.train(was_training)
    return correct / total


def train_first_last(
    *,
    steps: int = 300,
    length: int = 12,
    vocab_size: int = 64,
    batch_size: int = 64,
    lr: float = 2e-3,
    seed: int = 7,
    config: EncoderConfig | None = None,
    eval_batches: int = 16,
    log: Callable[[int, float], None] | None = None,
) -> ClassifyResult:
    """Train on first-last match and return held-out accuracy (linear warmup then decay)."""
    if steps < 1:
        raise LaminaError(f"steps must be >= 1, got {steps}")
    torch.manual_seed(seed)
    config = config or EncoderConfig(vocab_size=vocab_size, max_len=length, dropout=0.0)
    model = SequenceClassifier(config, n_classes=2, pooling="first")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.05, (steps - s) / (steps - warmup + 1)))
    )
    train_gen = torch.Generator().manual_seed(seed)
    held_gen = torch.Generator().manual_seed(seed + 10_000)
    held = [
        first_last_batch(256, length, vocab_size, generator=held_gen) for _ in range(eval_batches)
    ]
    start = time.perf_counter()
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(1, steps + 1):
        ids, labels = first_last_batch(batch_size, length, vocab_size, generator=train_gen)
        loss = F.cross_entropy(model(ids), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if log is not None and (step == 1 or step % 50 == 0 or step == steps):
            log(step, loss.item())
    return ClassifyResult(steps, loss.item(), accuracy(model, held), time.perf_counter() - start)

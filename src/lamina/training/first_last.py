"""The encoder classifier's toy task ("first-last"): does a random sequence's first token equal
its last? Synthetic data (`lamina.data.toy_tasks`), fresh every step.

    FirstLastOptions          this task's own fields (none: its shape comes from --d-model,
                              --max-len (the length) and --vocab-size model overrides)
    build(cfg, run_path, model_cfg) -> Built
    FirstLastObjective(length, vocab_size, seed, n_eval)    the loop's objective
    first_last_bytes(encoder_config, batch_size) -> int
        a generous estimate of the memory the task needs (weights + AdamW, attention scores
        and activations of a training step, the held-out batches); build refuses a shape over
        MAX_TASK_BYTES before allocating anything
    finished(out, result, objective) -> str   what `lamina train` prints after a run

Deliberately unaware of the loop, optimizers, files and the command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.data.toy_tasks import first_last_batch
from lamina.errors import LaminaError
from lamina.models.config import EncoderConfig
from lamina.models.encoder import SequenceClassifier
from lamina.training.config import TrainConfig
from lamina.training.objectives import Batch, Built, rng_state, rng_text

# the toy task is for seconds-to-minutes runs on a laptop: a shape needing more is a typo
MAX_TASK_BYTES = 4 * 2**30


@dataclass(frozen=True)
class FirstLastOptions:
    """first-last's own fields: none (its sequences are synthetic)."""


class FirstLastObjective:
    """Classify whether a random sequence's first token equals its last (fresh data each step)."""

    def __init__(self, length: int, vocab_size: int, seed: int, *, n_eval: int = 16) -> None:
        self.length, self.vocab_size, self.n_eval = length, vocab_size, n_eval
        self.tokens_per_item = length
        self.gen = torch.Generator().manual_seed(seed)
        self.held_seed = seed + 10_000

    def draw(self, n: int) -> Batch:
        return first_last_batch(n, self.length, self.vocab_size, generator=self.gen)

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        ids, labels = batch
        return F.cross_entropy(model(ids).float(), labels)

    def eval_batches(self) -> list[Batch]:
        held = torch.Generator().manual_seed(self.held_seed)
        return [
            first_last_batch(256, self.length, self.vocab_size, generator=held)
            for _ in range(self.n_eval)
        ]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batches: list[Batch]) -> dict[str, float]:
        losses, correct, total = [], 0, 0
        for ids, labels in batches:
            logits = model(ids).float()
            losses.append(float(F.cross_entropy(logits, labels)))
            correct += int((logits.argmax(-1) == labels).sum())
            total += labels.numel()
        return {"loss": sum(losses) / len(losses), "accuracy": correct / total}

    def state_dict(self) -> dict[str, Any]:
        return {"generator": rng_text(self.gen.get_state())}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.gen.set_state(rng_state(d["generator"]))


def build(cfg: TrainConfig, run_path: Path | None, model_cfg: dict[str, Any] | None) -> Built:
    """The encoder classifier and its synthetic task (length 12, vocabulary 64 by default)."""
    ec = (
        EncoderConfig.from_dict(model_cfg)
        if model_cfg
        else EncoderConfig(
            **{"vocab_size": 64, "max_len": 12, "dropout": 0.0, **cfg.model_overrides}
        )
    )
    need = first_last_bytes(ec, cfg.batch_size or 64)
    if need > MAX_TASK_BYTES:
        raise LaminaError(
            f"first-last with length {ec.max_len}, vocab_size {ec.vocab_size}, batch "
            f"{cfg.batch_size}, d_model {ec.d_model}, n_layers {ec.n_layers} would need about "
            f"{need / 2**30:,.1f} GiB (limit {MAX_TASK_BYTES / 2**30:g} GiB); choose a "
            "smaller length, batch or vocabulary"
        )
    objective = FirstLastObjective(ec.max_len, ec.vocab_size, cfg.seed)
    torch.manual_seed(cfg.seed)
    model = SequenceClassifier(ec, n_classes=2, pooling="first")
    return Built(objective, model, None, "first-last", ec.d_model)


def first_last_bytes(ec: EncoderConfig, batch_size: int, n_eval: int = 16) -> int:
    """Bytes the first-last task needs, over-estimated (fp32, AdamW, saved activations)."""
    length, d = ec.max_len, ec.d_model
    params = ec.vocab_size * d + length * d + ec.n_layers * (4 * d * d + 2 * d * ec.d_ff)
    weights = params * 4 * 4  # weights, gradients, two AdamW moments
    scores = batch_size * ec.n_heads * length * length * 4 * 3 * ec.n_layers  # kept for backward
    acts = batch_size * length * (8 * d + 2 * ec.d_ff) * 4 * ec.n_layers
    held = n_eval * 256 * length * 8 + 256 * ec.n_heads * length * length * 4 * 2  # eval batches
    return weights + scores + acts + held


def finished(out: str, result: dict[str, float], objective: Any) -> str:
    """What `lamina train` prints after a run, beside the validation line."""
    return f"  held-out accuracy {result['accuracy']:.1%}"

"""What the loop trains on: the small interface between the training loop and a model + data.

An `Objective` knows its data and its loss; the loop knows optimizers, schedules, precision and
checkpoints. Each training task (registry.py) builds one. A batch is a tuple of CPU tensors
whose first dimension is the sequence index, so the loop can slice a global batch into
per-process and per-micro-step pieces without knowing what the tensors mean.

    draw(n) -> batch            n items of the global batch (advances the objective's own RNG)
    loss(model, batch) -> ()    mean loss over the batch (every item weighs the same)
    eval_batches() -> [batch]   fixed held-out batches, the same on every call
    evaluate(model, batches)    {"loss": ..., and e.g. "accuracy"} in eval mode, no grad
    state_dict() / load_state_dict(d)   JSON-able RNG position, for an exact resume
    tokens_per_item             for tokens/s
    optional: eval_files() -> {name: bytes} written into the run after an evaluation
              (confusion.png); describe() -> str, a line printed before training

    Built(objective, model, tokenizer, fingerprint, width, ...)   what a task's build() returns
    rng_text(state) / rng_state(text)   a torch RNG state as base64 text and back (JSON only)

Deliberately unaware of optimizers, precision, devices beyond moving a batch, and files.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from lamina.tokenizers.kinds import Tokenizer

Batch = tuple[Tensor, ...]


class Objective(Protocol):
    """What the loop trains on (see the module docstring)."""

    tokens_per_item: int

    def draw(self, n: int) -> Batch: ...

    def loss(self, model: nn.Module, batch: Batch) -> Tensor: ...

    def eval_batches(self) -> list[Batch]: ...

    def evaluate(self, model: nn.Module, batches: list[Batch]) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, d: dict[str, Any]) -> None: ...


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Rows start:stop of every tensor in the batch."""
    return tuple(t[start:stop] for t in batch)


def to_device(batch: Batch, device: torch.device) -> Batch:
    if device.type == "cpu":
        return batch
    return tuple(t.to(device, non_blocking=True) for t in batch)


@dataclass
class Built:
    """What a task's build() hands the session: the objective, a seeded (or loaded) model."""

    objective: Objective
    model: nn.Module
    tokenizer: Tokenizer | None  # saved beside the model (None: the task has no text)
    fingerprint: str  # of the data, so a resume sees a change
    width: int  # the model's d_model, for the bf16 rule
    origin: dict[str, Any] | None = None  # --init-from: the model the run started from
    recorded: dict[str, Any] | None = None  # config fields the data decided (e.g. tokenizer)


def rng_text(state: Tensor) -> str:
    """A torch RNG state (a uint8 tensor) as base64 text, for JSON."""
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def rng_state(text: str) -> Tensor:
    """The uint8 RNG state tensor that `rng_text` wrote."""
    return torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype=np.uint8).copy())

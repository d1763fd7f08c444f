"""What the loop trains on: the small interface between the training loop and a model + data.

A `TrainTask` knows its data and its loss; the loop knows optimizers, schedules, precision and
checkpoints. A batch is a tuple of CPU tensors whose first dimension is the sequence index, so
the loop can slice a global batch into per-process and per-micro-step pieces without knowing
what the tensors mean.

    draw(n) -> batch            n items of the global batch (advances the task's own RNG)
    loss(model, batch) -> ()    mean loss over the batch (every item weighs the same)
    eval_batches() -> [batch]   fixed held-out batches, the same on every call
    evaluate(model, batches)    {"loss": ..., and e.g. "accuracy"} in eval mode, no grad
    state_dict() / load_state_dict(d)   JSON-able RNG position, for an exact resume
    tokens_per_item             for tokens/s

`rng_text(state)` / `rng_state(text)`: a torch RNG state as base64 text and back (JSON only).

`LMTask`: next-token prediction on windows of a token array (WindowSampler; validation batches
from the held-out tail). Given `val_chars` (the characters the validation tokens cover), its
evaluation adds "loss_per_char": the batches' mean loss per token x (val tokens - 1) /
val_chars, an estimate of nats per character over the whole validation text (exact for a char
tokenizer, where the ratio is 1; `lamina eval` computes it exactly). `FirstLastTask`: the
encoder classifier's synthetic task.

Scoring a whole split, for `lamina eval`:

    split_loss(model, tokens, block_size, batch_size) -> (mean loss in nats/token, tokens scored)
    summary(loss, n_tokens, unit, chars) -> {"loss", "perplexity", "bits_per_<unit>", "tokens"}
        and, given the characters the scored tokens cover, "loss_per_char" (total loss / chars)
        and "bits_per_char"

The split (1-D token array, length N) is cut into consecutive non-overlapping windows of
block_size + 1 tokens (the last, shorter window too, if it has at least 2 tokens); each window
scores its block_size next-token predictions, so every token after the first is predicted once,
with contexts from 1 to block_size, as in training. The mean is over tokens, not windows.

Deliberately unaware of optimizers, precision, devices beyond moving a batch, and files.
"""

from __future__ import annotations

import base64
import math
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.data.shards import eval_batches_for, sampler_for
from lamina.data.tasks import first_last_batch
from lamina.errors import LaminaError
from lamina.modes import eval_mode

Batch = tuple[Tensor, ...]


class TrainTask(Protocol):
    kind: str
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


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of logits (B, T, V) against targets (B, T), computed in fp32."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


class LMTask:
    """Next-token prediction on random windows of `train` tokens; eval on windows of `val`."""

    kind = "lm"

    def __init__(
        self,
        train: np.ndarray | Any,
        val: np.ndarray | Any,
        block_size: int,
        seed: int,
        *,
        n_eval: int = 20,
        eval_batch_size: int = 16,
        val_chars: int | None = None,
    ) -> None:
        for name, split in (("training", train), ("validation", val)):
            if len(split) < block_size + 1:
                raise LaminaError(
                    f"the {name} split has {len(split)} tokens, fewer than block_size + 1 = "
                    f"{block_size + 1}; use more data or a smaller --block-size"
                )
        self.train, self.val, self.block_size = train, val, block_size
        self.sampler = sampler_for(train, block_size, seed=seed)  # a TokenStream reads shards
        self.n_eval, self.eval_batch_size = n_eval, eval_batch_size
        self.tokens_per_item = block_size
        self._eval: list[Batch] | None = None
        # nats/char = nats/token x predicted tokens / their characters (None: unknown)
        self.chars_ratio = (len(val) - 1) / val_chars if val_chars else None

    def draw(self, n: int) -> Batch:
        return self.sampler.windows(self.sampler.starts(n))

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        x, y = batch
        return lm_loss(model(x), y)

    def eval_batches(self) -> list[Batch]:
        if self._eval is None:
            self._eval = eval_batches_for(
                self.val, self.block_size, self.eval_batch_size, self.n_eval, seed=1234
            )
        return self._eval

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batches: list[Batch]) -> dict[str, float]:
        losses = [float(self.loss(model, b)) for b in batches]
        loss = sum(losses) / len(losses)
        if self.chars_ratio is None:
            return {"loss": loss}
        return {"loss": loss, "loss_per_char": loss * self.chars_ratio}

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.sampler.load_state_dict(d["sampler"])


def rng_text(state: Tensor) -> str:
    """A torch RNG state (a uint8 tensor) as base64 text, for JSON."""
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def rng_state(text: str) -> Tensor:
    """The uint8 RNG state tensor that `rng_text` wrote."""
    return torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype=np.uint8).copy())


class FirstLastTask:
    """Classify whether a random sequence's first token equals its last (fresh data each step)."""

    kind = "first-last"

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


# -- a whole split, for `lamina eval` -----------------------------------------------------------
def _summed_loss(model: nn.Module, x: Tensor, y: Tensor) -> float:
    logits = model(x).float()
    return float(F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1), reduction="sum"))


@torch.no_grad()
def split_loss(
    model: nn.Module, tokens: np.ndarray, block_size: int, batch_size: int = 32
) -> tuple[float, int]:
    """Mean next-token cross-entropy over the whole split, and the number of tokens scored."""
    n = len(tokens)
    if n < 2:
        raise LaminaError(f"the validation split has {n} tokens; at least 2 are needed")
    ids = torch.from_numpy(np.asarray(tokens).astype(np.int64))
    full = (n - 1) // block_size
    starts = list(range(0, full * block_size, block_size))
    total, count = 0.0, 0
    with eval_mode(model):
        for i in range(0, len(starts), batch_size):
            chunk = starts[i : i + batch_size]
            x = torch.stack([ids[s : s + block_size] for s in chunk])
            y = torch.stack([ids[s + 1 : s + block_size + 1] for s in chunk])
            total, count = total + _summed_loss(model, x, y), count + y.numel()
        rest = n - 1 - full * block_size
        if rest > 0:
            s = full * block_size
            x, y = ids[s : s + rest][None], ids[s + 1 : s + rest + 1][None]
            total, count = total + _summed_loss(model, x, y), count + y.numel()
    return total / count, count


def summary(
    loss: float, n_tokens: int, unit: str = "token", chars: int | None = None
) -> dict[str, float | int | str]:
    """Loss (nats), perplexity and bits per `unit`; per character too where `chars` is known."""
    out: dict[str, float | int | str] = {
        "loss": loss,
        "perplexity": math.exp(loss) if loss < 700 else math.inf,
        f"bits_per_{unit}": loss / math.log(2),
        "tokens": n_tokens,
    }
    if chars:
        per_char = loss * n_tokens / chars
        out.update(loss_per_char=per_char, bits_per_char=per_char / math.log(2), chars=chars)
    return out


def val_line(result: dict[str, float]) -> str:
    """An evaluation in words: "1.6540 nats/char (2.3862 bits/char; 2.9500 nats/token)" where
    the per-character figure is known, else "loss 2.9500" (and any other metric after it,
    except per-class keys holding "/")."""
    loss = result["loss"]
    shown = (k for k in result if k not in ("loss", "loss_per_char") and "/" not in k)
    rest = [f"{k} {result[k]:.4f}" for k in shown]  # "x/y" keys: per-class detail, not shown
    if "loss_per_char" not in result:
        return "  ".join([f"loss {loss:.4f}", *rest])
    per_char = result["loss_per_char"]
    return "  ".join(
        [
            f"{per_char:.4f} nats/char ({per_char / math.log(2):.4f} bits/char; "
            f"{loss:.4f} nats/token)",
            *rest,
        ]
    )

"""Scoring a whole split, for `lamina eval`, and an evaluation in words.

    split_loss(model, tokens, block_size, batch_size) -> (mean loss in nats/token, tokens scored)
    summary(loss, n_tokens, unit, chars) -> {"loss", "perplexity", "bits_per_<unit>", "tokens"}
        and, given the characters the scored tokens cover, "loss_per_char" (total loss / chars)
        and "bits_per_char"
    val_line(result) -> "1.6540 nats/char (2.3862 bits/char; 2.9500 nats/token)"

The split (1-D token array, length N) is cut into consecutive non-overlapping windows of
block_size + 1 tokens (the last, shorter window too, if it has at least 2 tokens); each window
scores its block_size next-token predictions, so every token after the first is predicted once,
with contexts from 1 to block_size, as in training. The mean is over tokens, not windows.

Deliberately unaware of optimizers, training runs and files.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.errors import LaminaError
from lamina.modes import eval_mode


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

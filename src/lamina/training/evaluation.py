"""Held-out evaluation of a language model over a whole split, for `lamina eval`.

    split_loss(model, tokens, block_size, batch_size) -> (mean loss in nats/token, tokens scored)

The split (1-D token array, length N) is cut into consecutive non-overlapping windows of
block_size + 1 tokens (the last, shorter window too, if it has at least 2 tokens); each window
scores its block_size next-token predictions, so every token after the first is predicted once,
with contexts from 1 to block_size, as in training. The mean is over tokens, not windows.
`summary(loss, unit)` adds perplexity and bits per character / token.

Deliberately unaware of run directories, tokenizers and the command line.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lamina.errors import LaminaError


@torch.no_grad()
def split_loss(
    model: nn.Module, tokens: np.ndarray, block_size: int, batch_size: int = 32
) -> tuple[float, int]:
    """Mean next-token cross-entropy over the whole split, and the number of tokens scored."""
    n = len(tokens)
    if n < 2:
        raise LaminaError(f"the validation split has {n} tokens; at least 2 are needed")
    was = model.training
    model.eval()
    ids = torch.from_numpy(np.asarray(tokens).astype(np.int64))
    full = (n - 1) // block_size
    total, count = 0.0, 0
    try:
        starts = list(range(0, full * block_size, block_size))
        for i in range(0, len(starts), batch_size):
            chunk = starts[i : i + batch_size]
            x = torch.stack([ids[s : s + block_size] for s in chunk])
            y = torch.stack([ids[s + 1 : s + block_size + 1] for s in chunk])
            logits = model(x).float()
            total += float(
                F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1), reduction="sum")
            )
            count += y.numel()
        rest = n - 1 - full * block_size
        if rest > 0:
            s = full * block_size
            x, y = ids[s : s + rest][None], ids[s + 1 : s + rest + 1][None]
            logits = model(x).float()
            total += float(
                F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1), reduction="sum")
            )
            count += y.numel()
    finally:
        model.train(was)
    return total / count, count


def summary(loss: float, n_tokens: int, unit: str = "token") -> dict[str, float | int | str]:
    """Loss (nats), perplexity and bits per `unit` ("char" for character tokenizers)."""
    return {
        "loss": loss,
        "perplexity": math.exp(loss) if loss < 700 else math.inf,
        f"bits_per_{unit}": loss / math.log(2),
        "tokens": n_tokens,
    }

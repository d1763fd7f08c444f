"""Next-token loss over any text: per token, per character and bits per byte; a split's loss.

    token_nll(model, ids, window=None, stride=None, batch_size=8) -> (total nats, tokens scored)
    text_perplexity(model, tokenizer, texts, window=None, stride=None) -> PerplexityResult
    split_loss(model, tokens, block_size, batch_size=32) -> (mean nats/token, tokens scored)
    summary(loss, n_tokens, unit="token", chars=None) -> {"loss", "perplexity", ...}

The sliding window (Hugging Face's "Perplexity of fixed-length models" guide; lm-eval's
`loglikelihood_rolling` is the case stride = window): token 0 is given; tokens 1..N-1 are
predicted. Window j reads ids[j*stride : j*stride + window] and scores only the predictions no
earlier window scored, so every token is scored exactly once, and every token after the first
window sees at least window - stride tokens of context. `window` defaults to the model's
block_size and `stride` to window // 2 (each scored token has between window/2 and window
tokens before it). stride = window gives consecutive, non-overlapping windows: what training's
validation does (`split_loss`: contexts from 1 to block_size, the mean over tokens). A text
that fits one window (N - 1 <= window) is one forward whatever the stride.

`text_perplexity` scores each text on its own. Where the tokenizer has a BOS (else EOS) id, as
`PretrainedTokenizer`s do, it goes in front (lm-eval's prefix token) and every token of the text
is scored, so the characters and UTF-8 bytes are the whole text's; where it has none (lamina's
char, byte and BPE tokenizers), the first token is given and the characters and bytes are those
after it. Nats per character and bits per byte (total nats / ln 2 / bytes) compare models
with different tokenizers; nats per token does not.

Deliberately unaware of files and the command line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lamina.errors import LaminaError
from lamina.modes import eval_mode


def windows(n: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(input start, input end, first scored input position) for a text of n tokens: input
    ids[start:end] predicts ids[start+1:end+1]; positions >= the third value are scored."""
    if window < 1 or not 1 <= stride <= window:
        raise LaminaError(f"need 1 <= stride <= window, got stride {stride}, window {window}")
    out, done, start = [], 0, 0  # `done`: predicted tokens so far (targets 1..done)
    while done < n - 1:
        end = min(start + window, n - 1)
        out.append((start, end, done - start))
        done, start = end, start + stride
    return out


@torch.no_grad()
def token_nll(
    model: nn.Module,
    ids: Sequence[int] | np.ndarray,
    *,
    window: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    progress: Callable[[int], None] | None = None,
) -> tuple[float, int]:
    """Summed next-token loss (nats) over tokens 1..N-1 of `ids`, and how many were scored."""
    window = int(model.config.block_size) if window is None else window
    if window > model.config.block_size:
        raise LaminaError(
            f"window {window} exceeds the model's block_size {model.config.block_size}"
        )
    stride = max(1, window // 2) if stride is None else stride
    t = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    spans = windows(len(t), window, stride)
    device = model.reference_tensor().device if hasattr(model, "reference_tensor") else "cpu"
    total, count = 0.0, 0
    with eval_mode(model):
        i = 0
        while i < len(spans):  # windows of one length go together
            width = spans[i][1] - spans[i][0]
            group = [spans[i]]
            while (
                i + len(group) < len(spans)
                and len(group) < batch_size
                and spans[i + len(group)][1] - spans[i + len(group)][0] == width
            ):
                group.append(spans[i + len(group)])
            x = torch.stack([t[s:e] for s, e, _ in group]).to(device)
            y = torch.stack([t[s + 1 : e + 1] for s, e, _ in group]).to(device)
            logits = model(x).float()
            if all(first == 0 for _, _, first in group):  # every prediction counts: one sum
                total += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum"))
                count += y.numel()
            else:
                for r, (_, _, first) in enumerate(group):
                    part = F.cross_entropy(logits[r, first:], y[r, first:], reduction="sum")
                    total, count = total + float(part), count + width - first
            i += len(group)
            if progress is not None:
                progress(len(group))
    return total, count


@dataclass(frozen=True)
class PerplexityResult:
    nats: float  # summed next-token loss
    tokens: int  # tokens scored
    chars: int  # characters they cover
    bytes: int  # UTF-8 bytes they cover
    texts: int
    parts: tuple[PerplexityResult, ...] = ()  # one per text, in order (empty for a part)

    def as_dict(self) -> dict[str, float | int]:
        per_token = self.nats / self.tokens if self.tokens else math.nan
        per_char = self.nats / self.chars if self.chars else math.nan
        return {
            "loss": per_token,
            "perplexity": _exp(per_token),
            "bits_per_token": per_token / math.log(2),
            "loss_per_char": per_char,
            "bits_per_char": per_char / math.log(2),
            "bits_per_byte": self.nats / math.log(2) / self.bytes if self.bytes else math.nan,
            "tokens": self.tokens,
            "chars": self.chars,
            "bytes": self.bytes,
            "texts": self.texts,
        }


def _exp(x: float) -> float:
    return math.exp(x) if x < 700 else math.inf


def _prefix(tokenizer: Any) -> int | None:
    for name in ("bos_id", "eos_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return None


def text_perplexity(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    window: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    progress: Callable[[int], None] | None = None,
) -> PerplexityResult:
    """Every text scored on its own (see the module docstring); totals over all of them."""
    prefix = _prefix(tokenizer)
    parts = []
    for text in texts:
        ids = list(tokenizer.encode(text))
        if prefix is not None:
            ids, given = [prefix, *ids], ""
        else:
            given = tokenizer.decode(ids[:1]) if ids else ""
        n, k = 0.0, 0
        if len(ids) >= 2:  # else nothing to predict
            n, k = token_nll(model, ids, window=window, stride=stride, batch_size=batch_size)
        scored = text[len(given) :] if text.startswith(given) else text[max(1, len(given)) :]
        scored = scored if k else ""  # a text with nothing predicted covers no characters
        parts.append(PerplexityResult(n, k, len(scored), len(scored.encode("utf-8")), 1))
        if progress is not None:
            progress(1)
    tokens = sum(p.tokens for p in parts)
    if tokens == 0:
        raise LaminaError("no text had a token to predict (each needs at least 2 tokens)")
    return PerplexityResult(
        sum(p.nats for p in parts), tokens, sum(p.chars for p in parts),
        sum(p.bytes for p in parts), len(parts), tuple(parts),
    )  # fmt: skip


# -- a split, as training validates on it ------------------------------------------------------
def split_loss(
    model: nn.Module, tokens: np.ndarray | Sequence[int], block_size: int, batch_size: int = 32
) -> tuple[float, int]:
    """Mean next-token loss over a whole split in consecutive block_size windows (stride =
    block_size: every token after the first predicted once, contexts 1..block_size), and the
    number of tokens scored. What `lamina eval RUN` reports and a run's validation can call."""
    n = len(tokens)
    if n < 2:
        raise LaminaError(f"the validation split has {n} tokens; at least 2 are needed")
    total, count = token_nll(
        model, tokens, window=block_size, stride=block_size, batch_size=batch_size
    )
    return total / count, count


def summary(
    loss: float, n_tokens: int, unit: str = "token", chars: int | None = None
) -> dict[str, float | int | str]:
    """Loss (nats), perplexity and bits per `unit`; per character too where `chars` is known."""
    out: dict[str, float | int | str] = {
        "loss": loss,
        "perplexity": _exp(loss),
        f"bits_per_{unit}": loss / math.log(2),
        "tokens": n_tokens,
    }
    if chars:
        per_char = loss * n_tokens / chars
        out.update(loss_per_char=per_char, bits_per_char=per_char / math.log(2), chars=chars)
    return out

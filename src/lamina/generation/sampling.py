"""Sampling: next-token logits -> token ids, as pure functions.

    logits (B, V) --/ temperature--> --top-k--> --top-p--> softmax --> multinomial --> ids (B,)

`temperature == 0` means greedy (argmax; top-k and top-p are then irrelevant). Otherwise the
filters run in that order, as in Hugging Face's default: top-k keeps the k largest logits (ties
at the k-th value are all kept), top-p (nucleus) then keeps the smallest set of the most likely
tokens whose probability adds up to at least `top_p` (the most likely token is always kept).
Filtered tokens get probability exactly zero. Draws come from the `torch.Generator` given, so a
seeded generator gives the same tokens on every run: one uniform number per row, turned into a
token through the row's cumulative distribution (inverse transform sampling).

Cheap on one row of a large vocabulary, as a server samples each token: argmax and the draw
run in NumPy on CPU tensors (torch's reductions over one 49k row cost many times more), and
top-p sorts only the most likely tokens that reach p (the whole row only where they do not).

`check_sampling` validates the three settings once (a `LaminaError` naming the value);
`filter_logits` and `probabilities` expose the distribution that `sample` draws from, so tests
can compare sampled frequencies with it.

Deliberately unaware of models, caches and tokenizers: it sees a (B, V) tensor of logits.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from lamina.errors import LaminaError


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise `LaminaError` unless temperature >= 0, top_k >= 1 (or None), 0 < top_p <= 1 (or None)."""
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise LaminaError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise LaminaError(f"top_k must be an integer >= 1 (or None), got {top_k!r}")
    if top_p is not None and (
        isinstance(top_p, bool)
        or not isinstance(top_p, (int, float))
        or not (0.0 < top_p <= 1.0)  # also rejects NaN
    ):
        raise LaminaError(f"top_p must be in (0, 1] (or None), got {top_p!r}")


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Set every logit below the k-th largest of its row to -inf. (B, V) -> (B, V)."""
    if k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose probability sums to >= p. (B, V)."""
    if p >= 1.0:
        return logits
    probs = logits.softmax(-1)
    V, m = logits.shape[-1], min(logits.shape[-1], 64)
    while True:  # the m most likely tokens, sorted; more of them until they reach p
        top, order = torch.topk(probs, m, dim=-1)
        if m == V or bool((top.sum(-1) >= p).all()):
            break
        m = min(V, 8 * m)
    # drop a token when the tokens ranked before it already reach p (all past the m-th do)
    keep_sorted = (top.cumsum(-1) - top) < p
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def filter_logits(
    logits: Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """Logits / temperature, then top-k, then top-p; in float32. Needs temperature > 0."""
    if temperature <= 0:
        raise LaminaError(f"filter_logits needs temperature > 0, got {temperature!r}")
    out = logits.float() / temperature
    if top_k is not None:
        out = top_k_filter(out, top_k)
    if top_p is not None:
        out = top_p_filter(out, top_p)
    return out


def probabilities(
    logits: Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """The distribution `sample` draws from, (B, V) float32; one-hot argmax at temperature 0."""
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return filter_logits(logits, temperature, top_k, top_p).softmax(-1)


def sample(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Draw one token id per row: logits (B, V) -> ids (B,) int64.

    temperature 0 is greedy (argmax, no randomness). `generator` makes draws reproducible;
    None uses torch's global generator.
    """
    check_sampling(temperature, top_k, top_p)
    if logits.dim() != 2:
        raise LaminaError(f"logits must have shape (B, V), got {tuple(logits.shape)}")
    if temperature == 0:  # NumPy's argmax, as torch's, takes the first maximum
        return torch.from_numpy(logits.float().cpu().numpy().argmax(-1)).to(logits.device)
    z = filter_logits(logits, temperature, top_k, top_p).cpu().numpy()
    where = "cpu" if generator is None else generator.device
    u = torch.rand(z.shape[0], generator=generator, dtype=torch.float64, device=where)
    cdf = np.exp(z - z.max(-1, keepdims=True)).cumsum(-1, dtype=np.float64)  # flat where filtered
    total = cdf[:, -1]
    if not np.isfinite(total).all():
        raise LaminaError("cannot sample: the logits are not finite (NaN, or infinite everywhere)")
    target = np.minimum(u.cpu().numpy() * total, np.nextafter(total, 0.0))  # in [0, total)
    # the first token whose cumulative weight passes the target: never a zero-weight token
    return torch.from_numpy((cdf <= target[:, None]).sum(-1)).to(logits.device)

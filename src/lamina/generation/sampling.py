"""Sampling: next-token logits -> token ids, as pure functions.

    logits (B, V) --/ temperature--> --top-k--> --top-p--> softmax --> multinomial --> ids (B,)

`temperature == 0` means greedy (argmax; top-k and top-p are then irrelevant). Otherwise the
filters run in that order, as in Hugging Face's default: top-k keeps the k largest logits (ties
at the k-th value are all kept), top-p (nucleus) then keeps the smallest set of the most likely
tokens whose probability adds up to at least `top_p` (the most likely token is always kept).
Filtered tokens get probability exactly zero. Draws come from the `torch.Generator` given, so a
seeded generator gives the same tokens on every run: one uniform number per row, turned into a
token through the row's cumulative distribution (inverse transform sampling).

The rule itself runs once, in NumPy (`lamina.generation.pick`, which the torch-free runtime
uses too): cheap on one row of a large vocabulary, as a server samples each token (torch's
reductions over one 49k row cost many times more). Here it is applied to tensors.

`check_sampling` validates the three settings once (a `LaminaError` naming the value);
`filter_logits` and `probabilities` expose the distribution that `sample` draws from, so tests
can compare sampled frequencies with it.

Deliberately unaware of models, caches and tokenizers: it sees a (B, V) tensor of logits.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from lamina.errors import LaminaError
from lamina.generation.pick import check_sampling, draw_rows, filter_rows, top_k_rows, top_p_rows


def _rows(logits: Tensor, rule: Callable[..., np.ndarray], *args: object) -> Tensor:
    """`rule` (lamina.generation.pick's, on NumPy rows) applied to a tensor, on its device."""
    out = rule(logits.detach().float().cpu().numpy(), *args)
    return torch.from_numpy(np.ascontiguousarray(out)).to(logits.device)


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Set every logit below the k-th largest of its row to -inf. (B, V) -> (B, V)."""
    if k >= logits.shape[-1]:
        return logits
    return _rows(logits, top_k_rows, k).to(logits.dtype)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose probability sums to >= p. (B, V)."""
    if p >= 1.0:
        return logits
    return _rows(logits, top_p_rows, p).to(logits.dtype)


def filter_logits(
    logits: Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """Logits / temperature, then top-k, then top-p; in float32. Needs temperature > 0."""
    return _rows(logits, filter_rows, temperature, top_k, top_p)


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
    z = filter_rows(logits.detach().float().cpu().numpy(), temperature, top_k, top_p)
    where = "cpu" if generator is None else generator.device
    u = torch.rand(z.shape[0], generator=generator, dtype=torch.float64, device=where)
    return torch.from_numpy(draw_rows(z, u.cpu().numpy())).to(logits.device)

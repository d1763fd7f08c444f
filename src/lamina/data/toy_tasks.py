"""Small synthetic tasks with known answers, for checking that a model can learn at all.

Token convention (all tasks): id 0 is padding and never appears in generated data; id 1 is
the separator (SEP) in the sequence tasks; content tokens are drawn uniformly from the rest.
Every function takes ``generator: torch.Generator | None`` (None uses torch's global
generator) and returns int64 CPU tensors.

    ``first_last_batch(B, L, V) -> (ids (B, L), labels (B,))``: classification. ids in
    ``1 .. V-1``; label 1 iff ``ids[:, -1] == ids[:, 0]``. Exactly ``ceil(B / 2)`` positives
    and ``floor(B / 2)`` negatives, in shuffled order.
    ``copy_batch(B, L, V)`` / ``reverse_batch(B, L, V) -> (x (B, 2L), y (B, 2L))``: language
    modelling. With ``src`` drawn from ``2 .. V-1`` and ``s = src ++ [SEP] ++ tgt`` (``tgt`` is
    ``src`` or ``src`` reversed), ``x = s[:-1]`` and ``y = s[1:]``, except that ``y`` is
    ``IGNORE_INDEX`` (-100) at the first ``L`` positions: only the ``L`` positions whose next
    token is a ``tgt`` token are scored.
    ``TOY_TASKS``: name -> function.

What this module deliberately does not know: models, losses, devices, and the corpus code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lamina.data.batches import check_batch_ids, check_int
from lamina.errors import LaminaError

__all__ = [
    "IGNORE_INDEX",
    "PAD_ID",
    "SEP_ID",
    "TOY_TASKS",
    "copy_batch",
    "first_last_batch",
    "reverse_batch",
]

PAD_ID = 0
SEP_ID = 1
IGNORE_INDEX = -100
MAX_VOCAB = 2**31  # far above any embedding table; keeps torch.randint's bounds in range


def _check_generator(generator: Any) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise LaminaError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    if generator is not None and generator.device.type != "cpu":
        raise LaminaError(f"generator must be a CPU generator, got device {generator.device}")


def first_last_batch(
    batch_size: int,
    length: int = 12,
    vocab_size: int = 64,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences labelled 1 when the last token equals the first, else 0 (exactly balanced)."""
    batch_size = check_int(batch_size, "batch_size", 1)
    length = check_int(length, "length", 2)
    vocab_size = check_int(vocab_size, "vocab_size", 3, MAX_VOCAB)
    check_batch_ids(batch_size, length, "batch_size x length")
    _check_generator(generator)
    ids = torch.randint(1, vocab_size, (batch_size, length), generator=generator)
    n_pos = (batch_size + 1) // 2
    ordered = torch.cat(
        [torch.ones(n_pos, dtype=torch.int64), torch.zeros(batch_size - n_pos, dtype=torch.int64)]
    )
    labels = ordered[torch.randperm(batch_size, generator=generator)]
    first = ids[:, 0]
    # Negatives: shift the first token by 1 .. V-2 within the V-1 content ids 1 .. V-1, so the
    # last token is uniform over the content ids other than the first.
    shift = torch.randint(1, vocab_size - 1, (batch_size,), generator=generator)
    different = (first - 1 + shift) % (vocab_size - 1) + 1
    ids[:, -1] = torch.where(labels == 1, first, different)
    return ids, labels


def _seq_batch(
    batch_size: int,
    length: int,
    vocab_size: int,
    generator: torch.Generator | None,
    reverse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch_size = check_int(batch_size, "batch_size", 1)
    length = check_int(length, "length", 1)
    vocab_size = check_int(vocab_size, "vocab_size", 4, MAX_VOCAB)
    check_batch_ids(batch_size, 2 * length + 1, "batch_size x (2 x length + 1)")
    _check_generator(generator)
    src = torch.randint(SEP_ID + 1, vocab_size, (batch_size, length), generator=generator)
    tgt = src.flip(1) if reverse else src
    sep = torch.full((batch_size, 1), SEP_ID, dtype=torch.int64)
    s = torch.cat([src, sep, tgt], dim=1)
    x = s[:, :-1].contiguous()
    y = s[:, 1:].clone()
    y[:, :length] = IGNORE_INDEX
    return x, y


def copy_batch(
    batch_size: int,
    length: int = 12,
    vocab_size: int = 64,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of shape (B, 2L): after SEP the model must repeat the L source tokens."""
    return _seq_batch(batch_size, length, vocab_size, generator, reverse=False)


def reverse_batch(
    batch_size: int,
    length: int = 12,
    vocab_size: int = 64,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of shape (B, 2L): after SEP the model must write the L source tokens backwards."""
    return _seq_batch(batch_size, length, vocab_size, generator, reverse=True)


TOY_TASKS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "first-last": first_last_batch,
    "copy": copy_batch,
    "reverse": reverse_batch,
}

"""What the batch (`batch.py`) is given and what it sends back: a `Sequence` to continue, with
its `Sampling`; a `Token` event per sampled token, then a `Done`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lamina.generation.prompts import TextStream


@dataclass(frozen=True)
class Sampling:
    """How one sequence is sampled and when it stops."""

    max_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None: none; k >= 0: the token's log-probability and top k


@dataclass(frozen=True)
class Token:
    id: int
    text: str  # the text this token completes ("" while a character or a stop is pending)
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Done:
    finish: str  # "stop", "length" or "cancelled"
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    text: str  # the whole text


class Sequence:
    """One prompt to continue; see the module docstring."""

    def __init__(
        self,
        ids: list[int],
        sampling: Sampling,
        sink: Callable[[str, Any], None],
        *,
        constraint: Any = None,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
    ) -> None:
        self.ids, self.sampling, self.sink = list(ids), sampling, sink
        self.constraint, self.deadline = constraint, deadline
        self.cancel = cancel or threading.Event()
        self.out: list[int] = []
        self.pending: int | None = None  # sampled, not yet in the cache
        self.cached = 0
        self.text: TextStream | None = None
        self.generator: torch.Generator | None = None

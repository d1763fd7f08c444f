"""The torch model's engine behind a `Conversation`: its KV caches and the ids they hold.

    cache = PrefixCache(model, capacity, dtype=None)
    logits, reused = cache.prefill(ids)     (1, V): only the ids past the common prefix run
    logits = cache.step(token)
    cache.forget(n)                                keep the first n tokens
    cache.sampler(options) -> token of logits      lamina.generation.sampling, a torch.Generator
    with cache.running(): ...                      eval mode, no autograd

The native runtime's engine (`RuntimeCache`, torch-free) is in lamina.generation.conversation;
both give a `Conversation` the same calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from lamina.errors import LaminaError
from lamina.generation.sampling import sample
from lamina.generation.stops import common_prefix
from lamina.models.gpt import GPT
from lamina.modes import eval_mode
from lamina.native import NativeStep, native_step, usable


class PrefixCache:
    """KV caches of one sequence plus the ids they hold: a new prompt reuses their common
    prefix and computes only the rest.

    With longrope rotary scaling the cached keys were rotated with the short or the long
    factors, as the sequence's length chose when they were computed; where the length now
    chooses the other set, everything is computed again (the same logits as a fresh forward).
    """

    def __init__(self, model: GPT, capacity: int, dtype: torch.dtype | None = None) -> None:
        self.model, self.capacity = model, capacity
        self.caches = model.make_caches(1, capacity, dtype=dtype)
        self.ids: list[int] = []  # tokens whose keys and values are in `caches`, in order
        self._native: NativeStep | None = None  # built at each prefill (the model's tensors then)
        self._factors: bool | None = None  # longrope: whether the cached keys used long factors

    def _long_factors(self, length: int) -> bool | None:
        """Whether a sequence of `length` tokens rotates with longrope's long factors (None
        without longrope)."""
        s = self.model.config.rope_scaling
        return None if s is None or s.kind != "longrope" else length > s.original_max_positions

    def prefill(self, ids: list[int]) -> tuple[Tensor, int]:
        """Logits (1, V) after `ids`, computing only what the cache lacks; and how many of
        `ids` were reused."""
        if not 0 < len(ids) <= self.capacity:
            raise LaminaError(f"a prompt of {len(ids)} tokens does not fit {self.capacity}")
        reused = min(common_prefix(self.ids, ids), len(ids) - 1)
        if self._long_factors(len(ids)) != self._factors:
            reused = 0
        self._factors = self._long_factors(len(ids))
        del self.ids[reused:]
        for c in self.caches:
            c.pos = reused
        device = self.model.reference_tensor().device
        new = torch.tensor([ids[reused:]], device=device)
        logits = self.model(new, caches=self.caches, last_only=True)[:, -1]
        self.ids.extend(ids[reused:])
        self._native = native_step(self.model, self.caches)
        return logits, reused

    def step(self, token: int) -> Tensor:
        """Append one token; logits (1, V) for the next."""
        if self._long_factors(len(self.ids) + 1) != self._factors:
            return self.prefill([*self.ids, token])[0]
        if self._native is not None and usable(self.model):
            logits = self._native.step([token], [self.caches[0].pos], [0])
        else:
            device = self.model.reference_tensor().device
            logits = self.model(torch.tensor([[token]], device=device), caches=self.caches)[:, -1]
        self.ids.append(token)
        return logits

    def forget(self, n: int) -> None:
        """Keep the cache's first n tokens (the rest is written over by the next prefill)."""
        del self.ids[max(0, n) :]
        for c in self.caches:
            c.pos = len(self.ids)

    @property
    def full(self) -> bool:
        return len(self.ids) >= self.capacity

    def sampler(self, options: Any) -> Callable[[Tensor], int]:
        """The token `options` (a ChatOptions) pick from logits, seeded per reply."""
        o, generator = options, None
        if o.seed is not None:
            device = self.model.reference_tensor().device
            generator = torch.Generator(device=device).manual_seed(o.seed)
        return lambda logits: int(sample(logits, o.temperature, o.top_k, o.top_p, generator))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The model in eval mode and no autograd, for a reply's prefill and steps."""
        with eval_mode(self.model), torch.no_grad():
            yield

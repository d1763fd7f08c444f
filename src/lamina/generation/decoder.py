"""The decoder: drives a GPT through a prefill and one decode step per token, with KV caches.

    Decoder(model, ids (B, T), pads, capacity)
    .prefill()          -> logits (B, V) for the token after the prompt
    .decode(tokens (B,)) -> appends them, logits (B, V) for the token after that

Prompts are left-padded: row i holds `pads[i]` pad tokens, then its prompt. Each row sees a
*window* `seq[i, start_i:L]` of the L tokens so far, numbered from position 0; keys outside it
(pads, and tokens the window has left behind) are masked, so a row in a batch computes what it
computes alone.

The window rule (past block_size), one rule for every path:
    at the prompt:           start_i = max(pads[i], T - block_size)   (the last block_size tokens)
    before each next token:  if L - start_i > block_size:  start_i = L - keep
That is, when a row's window is full, it jumps forward and keeps the newest `keep` tokens
(default 3/4 of block_size); positions restart at 0, so they always lie in [0, block_size).
With the cache, a jump re-fills the cache from the kept tokens ("re-prefill"); between jumps one
token is processed per step. Without the cache (`use_cache=False`) every step recomputes the
current window from scratch, so both paths see exactly the same tokens at the same positions
(a test holds them equal token for token). `keep = block_size` slides by one token per step,
which is the crop-to-block_size rule of `GPT.greedy` (and recomputes on every step).

With longrope rotary scaling the decoder also re-prefills at the step where a row's window
first passes original_max_positions: that row's tables then switch from the short to the long
factors for every position (as transformers' do for a full forward), so the cached path stays
equal to the recompute.

Deliberately unaware of sampling, stopping and tokenizers: tokens in, logits out.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lamina.attention import KVCache
from lamina.errors import LaminaError
from lamina.generation.fast import FixedKVCache, StepFn, fixed_caches, fixed_step
from lamina.models.gpt import GPT
from lamina.native import native_step, usable


def default_keep(block_size: int) -> int:
    """Tokens a full window keeps when it jumps: 3/4 of block_size (at least 1)."""
    return max(1, (3 * block_size) // 4)


def slide(starts: list[int], length: int, block_size: int, keep: int) -> list[int]:
    """The window rule: a row whose window seq[start:length] exceeds block_size keeps `keep`."""
    return [length - keep if length - s > block_size else s for s in starts]


class Decoder:
    """Prefill and decode steps for a (B, T) left-padded batch; see the module docstring.

    Args:
        model: the GPT (its mode is the caller's business; use eval for generation).
        ids: (B, T) prompt ids, left-padded.
        pads: pad count of each row (0 for none); every row needs at least one real token.
        capacity: the most tokens the sequence will hold (T + new tokens).
        use_cache: keep per-layer KV caches (False: recompute the window at every step).
        keep: tokens kept when a window jumps (1..block_size; default `default_keep`).
        cache_dtype: dtype of the caches (default: the model's weights').
        fixed_shape: decode steps with fixed shapes (`fast.py`); `step` replaces `fixed_step`
            (e.g. by its compiled form).
    """

    def __init__(
        self,
        model: GPT,
        ids: Tensor,
        pads: list[int],
        capacity: int,
        *,
        use_cache: bool = True,
        keep: int | None = None,
        cache_dtype: torch.dtype | None = None,
        fixed_shape: bool = False,
        step: StepFn | None = None,
    ) -> None:
        B, T = ids.shape
        self.block_size = block = model.config.block_size
        keep = default_keep(block) if keep is None else keep
        if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= block:
            raise LaminaError(
                f"window_keep must be an integer in [1, block_size={block}], got {keep!r}"
            )
        if len(pads) != B or any(not 0 <= p < T for p in pads):
            raise LaminaError(f"pads must give 0 <= pad < T={T} for each of {B} rows, got {pads}")
        if capacity < T:
            raise LaminaError(f"capacity {capacity} is smaller than the prompt length {T}")
        self.model, self.keep, self.use_cache = model, keep, use_cache
        self.seq = torch.empty(B, capacity, dtype=torch.long, device=ids.device)
        self.seq[:, :T] = ids
        self.length = T
        self.starts = [max(p, T - block) for p in pads]
        self.caches: list[KVCache] | None = None
        self._step: StepFn | None = None
        self._steady = False
        self._native = None  # the whole cached step in one native call, where it runs
        if use_cache and (fixed_shape or step is not None):
            self.caches = fixed_caches(model, B, min(block, capacity), cache_dtype)
            self._step = step or fixed_step
            self._tok = torch.zeros(B, 1, dtype=torch.long, device=ids.device)
            self._shift = torch.zeros(B, 1, dtype=torch.long, device=ids.device)
        elif use_cache:
            self.caches = model.make_caches(B, min(block, capacity), dtype=cache_dtype)
            self._native = native_step(model, self.caches)
        self.prefilled = False
        self._cache_start = 0  # seq column of the first cached token

    def prefill(self) -> Tensor:
        """Process the prompt: logits (B, V) for the next token."""
        if self.prefilled:
            raise LaminaError("prefill was already called; use decode(tokens) for the next step")
        self.prefilled = True
        return self._recompute()

    def decode(self, tokens: Tensor) -> Tensor:
        """Append tokens (B,) to every row and return logits (B, V) for the token after them."""
        if not self.prefilled:
            raise LaminaError("decode called before prefill: call prefill() on the prompt first")
        if self.length >= self.seq.shape[1]:
            raise LaminaError(f"the sequence is full ({self.seq.shape[1]} tokens, its capacity)")
        self.seq[:, self.length] = tokens
        self.length += 1
        starts = slide(self.starts, self.length, self.block_size, self.keep)
        if not self.use_cache or starts != self.starts or self._rope_switches(starts):
            self.starts = starts
            return self._recompute()
        return self._cached_step()

    def _rope_switches(self, starts: list[int]) -> bool:
        """Whether this step is a row's first past longrope's original_max_positions (its newest
        token's position equals it)."""
        s = self.model.config.rope_scaling
        if s is None or s.kind != "longrope":
            return False
        return any(self.length - 1 - st == s.original_max_positions for st in starts)

    def tokens(self) -> Tensor:
        """Everything so far, (B, L): the prompts (with their pads) and the decoded tokens."""
        return self.seq[:, : self.length]

    def _window_masks(self, first: int, last: int) -> tuple[Tensor | None, Tensor | None]:
        """(padding_mask, positions) for seq columns first..last-1; (None, None) if unneeded."""
        if all(s == first for s in self.starts):
            return None, None
        cols = torch.arange(first, last, device=self.seq.device)
        starts = torch.tensor(self.starts, device=self.seq.device)[:, None]  # (B, 1)
        masked = cols[None, :] < starts  # (B, last - first), True outside the window
        positions = ((~masked).cumsum(-1) - 1).clamp(min=0)  # window starts at position 0
        return masked, positions

    def _recompute(self) -> Tensor:
        """Run the model over every row's whole window (prefill, or a step without cache)."""
        first, last = min(self.starts), self.length
        masked, positions = self._window_masks(first, last)
        if self.caches is not None:
            for cache in self.caches:
                cache.reset()
                if isinstance(cache, FixedKVCache):
                    cache.fixed = False
            self._cache_start = first
        logits = self.model(
            self.seq[:, first:last],
            masked,
            positions=positions,
            caches=self.caches,
            last_only=True,
        )
        if self._step is not None:
            self._shift.copy_(torch.tensor(self.starts)[:, None] - first)
            for cache in self.caches:
                cache.fixed = True
        return logits[:, -1]

    def _cached_step(self) -> Tensor:
        """One new token per row through the caches."""
        first, last = self._cache_start, self.length
        if self._step is not None:
            caches = self.caches
            self._tok.copy_(self.seq[:, last - 1 : last])
            caches[0].index.fill_(caches[0].pos)
            args = (self.model, caches, self._tok, caches[0].index, self._shift)
            if self._steady:
                # the very tensors of the previous call: run only the guards that choose
                # between compiled graphs, not the ones that re-check every weight
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    logits = self._step(*args)
            else:
                logits = self._step(*args)
                self._steady = self._step is not fixed_step
            for cache in caches:
                cache.pos += 1
            return logits
        if self._native is not None and usable(self.model):
            new = last - 1  # the new token's column; a row's window starts at its start
            return self._native.step(
                self.seq[:, new].tolist(),
                [new - s for s in self.starts],
                [s - first for s in self.starts],
            )
        masked, positions = self._window_masks(first, last)
        if positions is not None:
            positions = positions[:, -1:]
        logits = self.model(
            self.seq[:, last - 1 : last], masked, positions=positions, caches=self.caches
        )
        return logits[:, -1]

"""Random windows of a token array -> (x, y) batches for next-token prediction.

In and out:
    ``WindowSampler(tokens, block_size, seed)`` over a 1-D integer numpy array (a memmap is
    fine) of length ``N >= block_size + 1``.
    ``starts(batch_size) -> np.ndarray`` int64 ``(B,)``, uniform in ``[0, N - block_size - 1]``.
    ``windows(starts) -> (x, y)``: int64 CPU tensors of shape ``(B, block_size)`` with
    ``x[b, t] = tokens[starts[b] + t]`` and ``y[b, t] = tokens[starts[b] + t + 1]``.
    ``sample(batch_size)`` = ``windows(starts(batch_size))``.
    ``state_dict()`` / ``load_state_dict()``: JSON-able generator state, so a resumed run draws
    exactly the batches the uninterrupted run would have drawn.
    ``fixed_batches(...)``: the same evaluation batches on every call.
    A batch of more than ``MAX_BATCH_IDS`` (2**28) ids is refused before it is allocated (the
    synthetic tasks use the same bound).

Randomness comes only from ``numpy.random.Generator(PCG64(seed))`` owned by the sampler;
torch's global generator is never touched. Distributed training can draw the global batch
of starts once (same seed everywhere) and let each rank pass its slice to ``windows``.

What this module deliberately does not know: tokenizers, devices (tensors are returned on the
CPU; moving them is the caller's job), models and losses.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lamina.errors import LaminaError

__all__ = ["WindowSampler", "fixed_batches"]


MAX_BATCH_IDS = 2**28  # ids in one batch at most (2 GiB as int64): larger is refused up front


def check_int(value: Any, name: str, minimum: int, maximum: int | None = None) -> int:
    """An integer (Python or numpy, not bool) in [minimum, maximum], else a LaminaError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise LaminaError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise LaminaError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise LaminaError(f"{name} must be at most {maximum:,}, got {value:,}")
    return value


def check_batch_ids(rows: int, columns: int, what: str) -> None:
    """Refuse a batch of rows x columns ids above MAX_BATCH_IDS (before allocating it)."""
    if rows * columns > MAX_BATCH_IDS:
        raise LaminaError(
            f"{what}: {rows:,} x {columns:,} ids in one batch is more than {MAX_BATCH_IDS:,}"
        )


class WindowSampler:
    """Draws (x, y) windows of ``block_size`` tokens from one split, reproducibly."""

    def __init__(self, tokens: np.ndarray, block_size: int, seed: int = 0) -> None:
        if not isinstance(tokens, np.ndarray):
            raise LaminaError(f"tokens must be a numpy array, got {type(tokens).__name__}")
        if tokens.ndim != 1:
            raise LaminaError(f"tokens must be 1-D, got shape {tokens.shape}")
        if tokens.dtype.kind not in "iu":
            raise LaminaError(f"tokens must have an integer dtype, got {tokens.dtype}")
        self._block_size = check_int(block_size, "block_size", 1)
        self._seed = check_int(seed, "seed", 0)
        n = len(tokens)
        if n < self._block_size + 1:
            raise LaminaError(
                f"the split has {n} tokens, but block_size={self._block_size} needs at least "
                f"{self._block_size + 1} (block_size + 1); use a smaller block_size or more data"
            )
        self._tokens = tokens
        self._rng = np.random.Generator(np.random.PCG64(self._seed))
        self._batches_drawn = 0
        self._offsets = np.arange(self._block_size + 1, dtype=np.int64)

    @property
    def block_size(self) -> int:
        """Tokens per window (x and y each have this many columns)."""
        return self._block_size

    @property
    def n_tokens(self) -> int:
        """Length of the underlying token array."""
        return len(self._tokens)

    @property
    def seed(self) -> int:
        """The seed the generator started from."""
        return self._seed

    @property
    def batches_drawn(self) -> int:
        """How many times ``starts`` (hence ``sample``) has been called."""
        return self._batches_drawn

    def starts(self, batch_size: int) -> np.ndarray:
        """Draw ``batch_size`` window starts, int64, uniform in ``[0, n_tokens - block_size - 1]``.

        Counts as one batch drawn.
        """
        batch_size = check_int(batch_size, "batch_size", 1)
        check_batch_ids(batch_size, self._block_size + 1, "batch_size x (block_size + 1)")
        high = len(self._tokens) - self._block_size  # exclusive
        out = self._rng.integers(0, high, size=batch_size, dtype=np.int64)
        self._batches_drawn += 1
        return out

    def windows(self, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Build (x, y), int64 ``(len(starts), block_size)``, from the given window starts."""
        s = np.asarray(starts)
        if s.ndim != 1 or s.size == 0:
            raise LaminaError(f"starts must be a non-empty 1-D array, got shape {s.shape}")
        if s.dtype.kind not in "iu":
            raise LaminaError(f"starts must be integers, got dtype {s.dtype}")
        s = s.astype(np.int64, copy=False)
        high = len(self._tokens) - self._block_size - 1
        bad = (s < 0) | (s > high)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise LaminaError(
                f"starts[{i}] = {int(s[i])} is outside [0, {high}] for {len(self._tokens)} tokens "
                f"and block_size={self._block_size}"
            )
        idx = s[:, None] + self._offsets[None, :]
        buf = torch.from_numpy(np.asarray(self._tokens[idx]).astype(np.int64))
        # Separate storage for x and y, so in-place edits of one never change the other.
        return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw one batch: ``windows(starts(batch_size))``."""
        return self.windows(self.starts(batch_size))

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state; the 128-bit PCG64 words are decimal strings to survive any format."""
        st = self._rng.bit_generator.state
        return {
            "bit_generator": st["bit_generator"],
            "state": str(st["state"]["state"]),
            "inc": str(st["state"]["inc"]),
            "has_uint32": int(st["has_uint32"]),
            "uinteger": int(st["uinteger"]),
            "batches_drawn": self._batches_drawn,
            "seed": self._seed,
            "block_size": self._block_size,
            "n_tokens": len(self._tokens),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore a ``state_dict()``; the sampler must be over the same split and block size."""
        if not isinstance(d, dict):
            raise LaminaError(f"sampler state must be a dict, got {type(d).__name__}")
        needed = ("bit_generator", "state", "inc", "has_uint32", "uinteger", "batches_drawn")
        missing = [k for k in needed if k not in d]
        if missing:
            raise LaminaError(f"sampler state is missing fields: {missing}")
        if d["bit_generator"] != "PCG64":
            raise LaminaError(
                f"sampler state bit_generator must be 'PCG64', got {d['bit_generator']!r}"
            )
        for key, mine in (("block_size", self._block_size), ("n_tokens", len(self._tokens))):
            if key in d and d[key] != mine:
                raise LaminaError(
                    f"sampler state has {key}={d[key]!r} but this sampler has {key}={mine}; "
                    "it was saved for a different split or block size"
                )
        try:
            new_state = {
                "bit_generator": "PCG64",
                "state": {"state": int(d["state"]), "inc": int(d["inc"])},
                "has_uint32": int(d["has_uint32"]),
                "uinteger": int(d["uinteger"]),
            }
        except (TypeError, ValueError) as e:
            raise LaminaError(f"sampler state has a malformed generator state: {e}") from e
        batches = check_int(d["batches_drawn"], "batches_drawn", 0)
        rng = np.random.Generator(np.random.PCG64())
        try:
            rng.bit_generator.state = new_state
        except (TypeError, ValueError) as e:
            raise LaminaError(f"sampler state has a malformed generator state: {e}") from e
        self._rng = rng
        self._batches_drawn = batches
        if "seed" in d:
            self._seed = check_int(d["seed"], "seed", 0)


def fixed_batches(
    tokens: np.ndarray, block_size: int, batch_size: int, n_batches: int, seed: int = 1234
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_batches`` evaluation batches; the same windows for the same arguments, every call."""
    n_batches = check_int(n_batches, "n_batches", 1)
    sampler = WindowSampler(tokens, block_size, seed=seed)
    return [sampler.sample(batch_size) for _ in range(n_batches)]

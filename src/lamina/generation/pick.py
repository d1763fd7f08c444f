"""Sampling's rule on NumPy rows of logits: the one implementation behind every sampler.

    check_sampling(temperature, top_k, top_p)        a LaminaError naming a bad value
    filter_rows(logits (B, V), temperature, top_k, top_p) -> float32 (B, V), -inf where cut
    draw_rows(filtered (B, V), u (B,) in [0, 1)) -> ids (B,)   inverse transform sampling
    pick(logits (V,), temperature, top_k, top_p, rng) -> int   one token, NumPy's uniform

`lamina.generation.sampling` gives this rule on torch tensors (with a `torch.Generator`'s
uniforms, so seeded draws stay those of torch's generator); `lamina.native.runtime` and a
`Conversation` on it call `pick` on the runtime's NumPy logits, with `numpy.random.Generator`.

Temperature 0 is greedy (argmax, the first maximum). Otherwise: logits / temperature in
float32, then top-k keeps the k largest (ties at the k-th value all kept), then top-p keeps the
smallest set of the most likely tokens whose probability reaches p (the top token always
stays); filtered tokens get probability exactly zero. Top-p sorts only the most likely tokens
that reach p (the whole row only where they do not), so one row of a large vocabulary is cheap.

A leaf module (NumPy and lamina.errors only), so the torch-free runtime below the generation
layer can use it.
"""

from __future__ import annotations

import math

import numpy as np

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


def top_k_rows(z: np.ndarray, k: int) -> np.ndarray:
    """Every entry below the k-th largest of its row set to -inf (a new array)."""
    if k >= z.shape[-1]:
        return z.copy()
    kth = np.partition(z, z.shape[-1] - k, axis=-1)[..., -k, None]
    return np.where(z < kth, np.float32(-np.inf), z)


def softmax_rows(z: np.ndarray) -> np.ndarray:
    """softmax over the last axis, in the array's dtype (scaled by the sum's reciprocal, as
    torch's softmax is)."""
    e = np.exp(z - z.max(-1, keepdims=True))
    return e * (1 / e.sum(-1, keepdims=True))


def top_p_rows(z: np.ndarray, p: float) -> np.ndarray:
    """The smallest set of each row's most likely entries whose probability reaches p kept, the
    rest set to -inf (a new array)."""
    if p >= 1.0:
        return z.copy()
    probs = softmax_rows(z)
    V, m = z.shape[-1], min(z.shape[-1], 64)
    while True:  # the m most likely entries, sorted; more of them until they reach p
        part = np.argpartition(-probs, m - 1, axis=-1)[..., :m] if m < V else None
        order = np.broadcast_to(np.arange(V), probs.shape) if part is None else part
        top = np.take_along_axis(probs, order, -1)
        rank = np.argsort(-top, axis=-1, kind="stable")
        order, top = np.take_along_axis(order, rank, -1), np.take_along_axis(top, rank, -1)
        if m == V or bool((top.sum(-1, dtype=np.float64) >= p).all()):
            break
        m = min(V, 8 * m)
    # drop an entry when the entries ranked before it already reach p (all past the m-th do)
    keep_sorted = (top.cumsum(-1, dtype=np.float64) - top) < p  # summed as torch's cumsum does
    keep = np.zeros(z.shape, bool)
    np.put_along_axis(keep, order, keep_sorted, -1)
    return np.where(keep, z, np.float32(-np.inf))


def filter_rows(
    logits: np.ndarray, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> np.ndarray:
    """Logits (B, V) / temperature, then top-k, then top-p; float32. Needs temperature > 0."""
    if temperature <= 0:
        raise LaminaError(f"filtering needs temperature > 0, got {temperature!r}")
    z = logits.astype(np.float32) / np.float32(temperature)
    if top_k is not None:
        z = top_k_rows(z, top_k)
    if top_p is not None:
        z = top_p_rows(z, top_p)
    return z


def draw_rows(z: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One id per row of filtered logits (B, V), through the row's cumulative distribution at
    the uniform u (B,) in [0, 1): never a token of probability zero."""
    cdf = np.exp(z - z.max(-1, keepdims=True)).cumsum(-1, dtype=np.float64)  # flat where cut
    total = cdf[:, -1]
    if not np.isfinite(total).all():
        raise LaminaError("cannot sample: the logits are not finite (NaN, or infinite everywhere)")
    target = np.minimum(u * total, np.nextafter(total, 0.0))  # in [0, total)
    return (cdf <= target[:, None]).sum(-1)


def pick(
    logits: np.ndarray,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    rng: np.random.Generator | None = None,
) -> int:
    """One token from logits (V,): the argmax at temperature 0, else a draw with `rng`'s
    uniform (a fresh unseeded generator when None)."""
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return int(np.argmax(logits))
    z = filter_rows(np.asarray(logits).reshape(1, -1), temperature, top_k, top_p)
    u = (rng if rng is not None else np.random.default_rng()).random(1)
    return int(draw_rows(z, u)[0])

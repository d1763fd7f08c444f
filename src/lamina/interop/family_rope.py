"""Rope scalings that GGUF files carry as tensors, in both directions.

    freq_factors(scaling, width, theta) -> (width/2,) float32    what llama.cpp divides each
                                   rotary frequency by: `rope_freqs.weight` of a Llama 3.x file
    llama3_from_factors(factors, width, theta) -> RopeScaling | None   the llama3 scaling that
                                   gives exactly these factors (None: no llama3 scaling does)

llama.cpp's converter writes Llama 3.1+'s "llama3" scaling as one factor per frequency (1 for
short wavelengths, `factor` for long ones, 1 / ((1 - s) / factor + s) between), without the
scaling's parameters. Reading it back: `factor` is the largest factor; a blended frequency's
s = (1 / f - 1 / factor) / (1 - 1 / factor) is linear in 1 / wavelength, s = original / (wl
(high - low)) - low / (high - low), so two blended frequencies give the line; only the bounds
original / low and original / high change what is computed, so low_freq_factor = 1 is taken
(Llama 3.x's own). With fewer than two blended frequencies the bounds are placed inside the
gaps (the one blended frequency fixing the other). Whatever is found is checked by recomputing every factor (relative 1e-5), else None.
Deliberately unaware of files.
"""

from __future__ import annotations

import math

import numpy as np

from lamina.attention import RopeScaling, rotary_frequencies


def freq_factors(scaling: RopeScaling, width: int, theta: float) -> np.ndarray:
    """plain / scaled frequency for each rotary pair (llama.cpp's freq_factors)."""
    plain = rotary_frequencies(width, theta).double()
    scaled = rotary_frequencies(width, theta, scaling).double()
    return (plain / scaled).float().numpy()


def _matches(scaling: RopeScaling, factors: np.ndarray, width: int, theta: float) -> bool:
    got = freq_factors(scaling, width, theta).astype(np.float64)
    return bool(np.allclose(got, factors, rtol=1e-5, atol=0))


def llama3_from_factors(factors: np.ndarray, width: int, theta: float) -> RopeScaling | None:
    """The llama3 RopeScaling whose frequency factors are `factors` (see the docstring)."""
    f = np.asarray(factors, dtype=np.float64).reshape(-1)
    if f.size * 2 != width or not np.all(np.isfinite(f)) or f.min() <= 0:
        return None
    factor = float(f.max())
    if factor <= 1.0:
        return None
    inv = rotary_frequencies(width, theta).double().numpy()
    wavelen = 2 * math.pi / inv
    keep, full = np.isclose(f, 1.0, rtol=1e-6), np.isclose(f, factor, rtol=1e-6)
    mid = ~(keep | full)
    try:
        if mid.sum() >= 2:
            s = (1 / f[mid] - 1 / factor) / (1 - 1 / factor)
            slope, intercept = np.polyfit(1 / wavelen[mid], s, 1)  # s = a / wl - b
            high = 1 + 1 / -intercept  # low = 1: b = 1 / (high - 1), a = original b
            original = slope / -intercept
        else:  # one or no blended frequency: bounds placed inside the gaps, then fitted
            kept = wavelen[keep].max() if keep.any() else wavelen.min() / 2
            divided = wavelen[full].min() if full.any() else wavelen.max() * 2
            if mid.any():
                w = float(wavelen[mid][0])
                s = (1 / f[mid][0] - 1 / factor) / (1 - 1 / factor)
                original = round(math.sqrt(w * divided))
                high = 1 + (original / w - 1) / s
            else:
                original = round(kept ** (1 / 3) * divided ** (2 / 3))
                high = original / (kept ** (2 / 3) * divided ** (1 / 3))
        candidate = RopeScaling("llama3", factor, 1.0, float(high), round(float(original)))
    except (ValueError, ZeroDivisionError, FloatingPointError, np.linalg.LinAlgError):
        return None
    return candidate if _matches(candidate, f, width, theta) else None

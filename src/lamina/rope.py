"""Layer 3, rotary positions (RoPE): frequencies, their long-context scalings, the cos/sin tables.

    inv_freq (r/2,) = theta^(-2j/r)      r = the rotated width: head_dim, or rotary_dim (partial)
    tables (cos, sin), each (*positions.shape, r): angle of pair j at position p = p inv_freq[j]
    apply_rotary(x (B, H, T, hd)): the first r dims rotated, half-split; dims r.. pass through

Half-split layout: dimension j of the rotated part is paired with j + r/2, as Hugging Face's
`rotate_half` (GPT-NeoX's layout; Meta's Llama code pairs (2j, 2j+1), and HF's conversion
permutes W_q and W_k into half-split, so HF weights copy into lamina unpermuted). Partial
rotary (Phi-3's partial_rotary_factor, GPT-NeoX's rotary_pct) rotates only the first r dims.

`RopeScaling` stretches the frequencies for contexts longer than training:
  * "linear": every frequency / factor;
  * "llama3" (Llama 3.1+): low frequencies (wavelength above original_max_positions /
    low_freq_factor) / factor, high ones (below ... / high_freq_factor) kept, a linear blend
    between, exactly as transformers' `_compute_llama3_parameters`;
  * "longrope" (Phi-3 128k, Phi-4-mini): inv_freq[j] = theta^(-2j/r) / ext[j], with
    ext = short_factor while the sequence is at most original_max_positions long and
    long_factor past it (the sequence length is the largest position + 1, as transformers'
    `longrope_frequency_update` decides it; for (B, T) positions each row decides for itself,
    so a row computes in a batch what it computes alone); cos and sin are multiplied
    by attention_factor, by default sqrt(1 + ln(factor) / ln(original_max_positions)) (1 when
    factor <= 1), as `_compute_longrope_parameters`. A cached decode that crosses
    original_max_positions keeps its earlier keys rotated with the short factors, as
    transformers' does.

Deliberately unaware of attention, heads and caches: positions in, tables out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lamina.errors import LaminaError

ROPE_KINDS = ("linear", "llama3", "longrope")


def _positive(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies are stretched for long contexts (None in a config: not at all).

    kind "linear": every frequency / factor. kind "llama3": low frequencies / factor, high ones
    kept, a linear blend between (wavelengths compared with original_max_positions divided by
    low_freq_factor and by high_freq_factor). kind "longrope": per-pair factors, short_factor
    up to original_max_positions and long_factor past it, tables times attention_factor.
    """

    kind: Literal["linear", "llama3", "longrope"]
    factor: float  # longrope: only sets the default attention_factor (HF: max_pos / original)
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_positions: int = 8192  # llama3, longrope: the context the model was trained at
    short_factor: tuple[float, ...] | None = None  # longrope only: one per rotated pair
    long_factor: tuple[float, ...] | None = None  # longrope only
    attention_factor: float | None = None  # longrope only; None: the formula above

    def __post_init__(self) -> None:
        if self.kind not in ROPE_KINDS:
            raise LaminaError(
                f"rope_scaling kind must be one of {', '.join(map(repr, ROPE_KINDS))}, "
                f"got {self.kind!r}"
            )
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            value = getattr(self, name)
            if not _positive(value):
                raise LaminaError(f"rope_scaling {name} must be a positive number, got {value!r}")
        if not self.high_freq_factor > self.low_freq_factor:
            raise LaminaError(
                f"rope_scaling high_freq_factor={self.high_freq_factor} must exceed "
                f"low_freq_factor={self.low_freq_factor}"
            )
        n = self.original_max_positions
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise LaminaError(
                f"rope_scaling original_max_positions must be a positive integer, got {n!r}"
            )
        longrope = self.kind == "longrope"
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if value is None:
                if longrope:
                    raise LaminaError(f"rope_scaling kind 'longrope' needs {name}")
                continue
            if not longrope:
                raise LaminaError(f"rope_scaling {name} belongs to kind 'longrope' only")
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise LaminaError(f"rope_scaling {name} must be a list of numbers, got {value!r}")
            value = tuple(value)  # a JSON list becomes a tuple (the config stays hashable)
            if not value or not all(_positive(v) for v in value):
                raise LaminaError(f"rope_scaling {name} must be positive numbers, got {value!r}")
            object.__setattr__(self, name, tuple(float(v) for v in value))
        if longrope and len(self.short_factor) != len(self.long_factor):
            raise LaminaError(
                f"rope_scaling short_factor ({len(self.short_factor)}) and long_factor "
                f"({len(self.long_factor)}) must have the same length"
            )
        if self.attention_factor is not None:
            if not longrope:
                raise LaminaError("rope_scaling attention_factor belongs to kind 'longrope' only")
            if not _positive(self.attention_factor):
                raise LaminaError(
                    f"rope_scaling attention_factor must be a positive number, "
                    f"got {self.attention_factor!r}"
                )

    @property
    def magnitude(self) -> float:
        """What cos and sin are multiplied by: attention_factor (longrope's default formula
        where it is None); 1 for the other kinds."""
        if self.kind != "longrope":
            return 1.0
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_positions))


def rotary_frequencies(
    head_dim: int,
    theta: float = 10000.0,
    scaling: RopeScaling | None = None,
    device: torch.device | str | None = None,
    *,
    long: bool = False,
) -> Tensor:
    """The (r/2,) float32 angular frequencies theta^(-2j/r) of a rotated width r = `head_dim`,
    stretched by `scaling` (longrope: its short factors, or its long ones with `long`)."""
    exponents = torch.arange(0, head_dim, 2, device=device).float() / head_dim
    if scaling is not None and scaling.kind == "longrope":
        ext = scaling.long_factor if long else scaling.short_factor
        if 2 * len(ext) != head_dim:
            raise LaminaError(
                f"rope_scaling longrope factors number {len(ext)}, but a rotated width of "
                f"{head_dim} has {head_dim // 2} pairs"
            )
        ext_t = torch.tensor(ext, dtype=torch.float32, device=device)
        return 1.0 / (ext_t * theta**exponents)
    inv_freq = 1.0 / (theta**exponents)  # (r/2,)
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    s = scaling
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = s.original_max_positions / s.low_freq_factor  # longer: divide by factor
    high_wavelen = s.original_max_positions / s.high_freq_factor  # shorter: keep
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_positions / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def rotary_tables(
    positions: Tensor,
    head_dim: int,
    theta: float = 10000.0,
    scaling: RopeScaling | None = None,
) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, each (*positions.shape, head_dim), float32.

    `head_dim` is the rotated width r. Angle of pair j (dims j and j + r/2) at position p:
    p * theta^(-2j/r), frequencies stretched by `scaling` when given. For longrope the short or
    long factors are chosen on the device (no host sync), by the largest position (of each row,
    for (B, T) positions).
    """
    inv_freq = rotary_frequencies(head_dim, theta, scaling, positions.device)
    if scaling is not None and scaling.kind == "longrope":
        long = rotary_frequencies(head_dim, theta, scaling, positions.device, long=True)
        last = positions.amax(-1, keepdim=True) if positions.dim() > 1 else positions.max()
        past = last + 1 > scaling.original_max_positions  # () or (B, 1)
        inv_freq = torch.where(past[..., None], long, inv_freq)  # (r/2,) or (B, 1, r/2)
    angles = positions.float()[..., None] * inv_freq  # (..., r/2)
    angles = torch.cat([angles, angles], dim=-1)  # (..., r): the same angle for j and j + r/2
    cos, sin = angles.cos(), angles.sin()
    if scaling is not None and scaling.magnitude != 1.0:
        cos, sin = cos * scaling.magnitude, sin * scaling.magnitude
    return cos, sin


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, H, T, hd) by tables (T, r) or (B, T, r) from `rotary_tables`: the first r
    dims of each head rotate, the rest (r < hd: partial rotary) pass through unchanged."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, r): broadcast over heads
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return (x * cos + rotate_half(x) * sin).to(x.dtype)
    rot, rest = x[..., :r], x[..., r:]
    return torch.cat([(rot * cos + rotate_half(rot) * sin).to(x.dtype), rest], dim=-1)

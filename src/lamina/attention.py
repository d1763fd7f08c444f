"""Layer 4, attention: multi-head self-attention with masks, optional weights and a KV cache.

    x (B, T, d) -> qkv = x @ W_qkv (one fused projection, [q | k | v] along the output)
    q (B, H, T, hd), k and v (B, H_kv, T, hd)    hd = d / H unless given (Qwen3: d != H hd),
                                                  H_kv = n_kv_heads divides H
    [qk-norm: q, k <- rms_norm(q), rms_norm(k) per head]  [rotary: q, k <- rotate(q), rotate(k)]
    scores = scale q k^T  (scale = 1/sqrt(hd) unless given: Gemma's query_pre_attn_scalar^-1/2)
    [soft cap: scores <- cap tanh(scores / cap)]   softmax(scores + mask) v -> (B, T, H hd)
    -> output projection -> (B, T, d)

Grouped-query attention: query head h reads key/value head h // (H / H_kv) (1 = multi-query;
H_kv = H is plain multi-head attention, with today's weight layout). The projection stays one
matmul of width (H + 2 H_kv) hd, and the KV cache holds H_kv heads.

Rotary positions come from `lamina.rope` (tables, scalings, partial rotary; re-exported here).
Keys are rotated before they are cached, so the cache holds rotated keys and a cached step only
rotates its new token. QK-norm (Qwen3, Gemma 3, OLMo 2's per-head form) is an RMSNorm over hd
with one learned gain (hd,) shared by the heads, applied to q and k before the rotation;
`rms_norm` with an offset applies (offset + gain) in float32, as Gemma's RMSNorm.

Masks:
  * causal (a constructor flag): query i sees keys 0..i (shifted by the cache position);
  * sliding window W (Mistral, Gemma's local layers): query i sees only keys j > i - W, as
    transformers' `sliding_window_overlay`; counted in cache slots, which are consecutive
    positions of a row (cached keys that fell out of the window are masked, not dropped);
  * padding_mask (B, T_keys) bool, True at pads: no query attends to a pad key.
  A query that may see no key at all (a fully padded row) outputs exactly zero, never NaN.

Two paths compute the same thing (a test proves it): the reference path writes the softmax out
(repeating each key/value head for its group) and can return the attention weights
(B, H, T_q, T_k); the fast path calls `F.scaled_dot_product_attention` (with `enable_gqa`),
except that a prompt's causal attention with no other mask, in float32 on a CPU recording no
gradient (a prefill), runs lamina.native's kernel where it runs (lamina.native.prefill), and so
does a training step's (bf16 or float32 on a CPU, recording gradients, no cache, no dropout,
T <= 256, hd a multiple of 8 up to 128: lamina.native.train_attention, whose backward is C too;
without norms or rotary positions it takes the fused projection's output whole).
`need_weights=True` always takes the reference path, and so does a soft cap: tanh acts on the
scores before the mask and softmax, which SDPA gives no hook for (a float mask only adds).
Attention dropout is applied only in training mode, on both paths.

`KVCache` is a preallocated (B, H_kv, max_len, hd) store with an explicit position: each forward
with a cache writes its keys and values at the current position and attends to everything stored.

Deliberately unaware of embeddings, blocks and models: it sees vectors and, for rotary
attention, integer positions, never token ids.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import lamina.native.train_attention as train_attention
from lamina.cpu import upcast_attention
from lamina.errors import LaminaError
from lamina.native.prefill import causal_attention
from lamina.rope import (  # noqa: F401 - re-exported: the rotary names' historical home
    RopeScaling,
    apply_rotary,
    rotary_frequencies,
    rotary_tables,
    rotate_half,
)

AttentionImpl = Literal["sdpa", "reference"]
RopeArg = tuple[Tensor, Tensor] | dict[str, tuple[Tensor, Tensor]]


def rms_norm(x: Tensor, weight: Tensor | None, eps: float, offset: float = 0.0) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim. With an offset the gain is
    (offset + weight), and the whole norm runs in float32 and is cast back (Gemma's RMSNorm);
    without one, torch's fused kernel in x's dtype (Llama's)."""
    if not offset:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    gain = None if weight is None else offset + weight.float()
    return F.rms_norm(x.float(), (x.shape[-1],), gain, eps).to(x.dtype)


class KVCache:
    """Keys and values of one attention layer, preallocated up to `max_len` positions.

    `pos` counts the positions filled so far. `append(k, v)` writes (B, H, T, hd) at `pos`,
    advances it and returns views of everything stored, (B, H, pos, hd). A batch smaller than the
    cache uses its first rows; a larger batch, or writing past `max_len`, is an error.
    """

    def __init__(
        self,
        batch_size: int,
        n_heads: int,
        max_len: int,
        head_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        for name, value in (
            ("batch_size", batch_size),
            ("n_heads", n_heads),
            ("max_len", max_len),
            ("head_dim", head_dim),
        ):
            if not isinstance(value, int) or value <= 0:
                raise LaminaError(f"KVCache {name} must be a positive integer, got {value!r}")
        shape = (batch_size, n_heads, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.pos = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def reset(self) -> None:
        """Forget everything stored (the buffers are reused)."""
        self.pos = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        B, H, T, hd = k.shape
        if B > self.k.shape[0]:
            raise LaminaError(f"batch of {B} is larger than the KV cache's {self.k.shape[0]}")
        if (H, hd) != (self.k.shape[1], self.k.shape[3]):
            raise LaminaError(
                f"KV cache holds {self.k.shape[1]} heads of {self.k.shape[3]}, got {H} of {hd}"
            )
        end = self.pos + T
        if end > self.max_len:
            raise LaminaError(
                f"KV cache is full: {self.pos} stored + {T} new > max_len {self.max_len}"
            )
        self.k[:B, :, self.pos : end] = k
        self.v[:B, :, self.pos : end] = v
        self.pos = end
        return self.k[:B, :, :end], self.v[:B, :, :end]


def attention_mask(
    t_q: int,
    t_k: int,
    *,
    causal: bool,
    padding_mask: Tensor | None,
    device: torch.device,
    window: int | None = None,
) -> Tensor | None:
    """Boolean (B or 1, 1, t_q, t_k) mask, True where a query may attend; None if all may.

    Queries are the last t_q of the t_k positions (a cache holds the first t_k - t_q). With a
    sliding `window`, query i also sees only keys j > i - window (applied only where it hides
    a key: a window at least t_k wide adds no mask). A single query with a padding mask sits
    at its row's last unmasked key instead: a caller that steps rows at different positions
    (a fixed-shape cache, a continuous batch) masks the columns past each row's query, and the
    query always sees itself.
    """
    allowed = None
    windowed = window is not None and t_k > window
    if (causal and t_q > 1) or windowed:
        q_pos = torch.arange(t_k - t_q, t_k, device=device)[:, None]
        k_pos = torch.arange(t_k, device=device)[None, :]
    if causal and t_q > 1:
        allowed = (k_pos <= q_pos)[None, None]
    if windowed:
        if t_q == 1 and padding_mask is not None:
            seen = (~padding_mask).flip(-1).to(torch.uint8)  # (B, t_k), the last key first
            last = t_k - 1 - seen.argmax(-1, keepdim=True)  # (B, 1): each row's query column
            near = (k_pos > last - window)[:, None, None, :]
        else:
            near = (k_pos > q_pos - window)[None, None]
        allowed = near if allowed is None else allowed & near
    if padding_mask is not None:
        keep = ~padding_mask[:, None, None, :]
        allowed = keep if allowed is None else allowed & keep
    return allowed


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection.

    Args:
        d_model: width in and out; must be divisible by n_heads unless head_dim is given.
        n_heads: number of heads.
        head_dim: width of each head (None: d_model / n_heads); q, k, v are H hd wide and the
            output projection maps H hd back to d_model.
        dropout: dropout on the attention weights (training mode only).
        causal: mask future keys.
        qkv_bias: bias on the QKV projection (GPT-2 has one; the seed notebook does not).
        bias: bias on the output projection.
        impl: "sdpa" (fast path) or "reference" (explicit softmax); settable later.
        n_kv_heads: key/value heads (grouped-query attention); None means n_heads.
        rope_theta: rotary positions with this base (None: no rotation; positions come from
            elsewhere). forward's `rope` passes precomputed tables; without it the positions
            are 0..T-1, continuing from the cache.
        rope_scaling: how those tables stretch their frequencies (see `RopeScaling`).
        rotary_dim: rotate only the first rotary_dim dims of each head (None: all hd).
        qk_norm: RMS-normalise q and k per head (over hd) before the rotation and dot product.
        qk_norm_gain: a learnable gain (hd,) for each of the q and k norms.
        norm_offset: the qk norms' gains are (norm_offset + gain), in float32 (Gemma 3: 1).
        eps: the qk norms' epsilon.
        sliding_window: each query sees only the last sliding_window keys (itself included).
        softcap: scores <- softcap tanh(scores / softcap) before the mask (Gemma 2).
        scale: the q.k multiplier (None: 1 / sqrt(hd)).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        dropout: float = 0.0,
        causal: bool = False,
        qkv_bias: bool = True,
        bias: bool = True,
        impl: AttentionImpl = "sdpa",
        n_kv_heads: int | None = None,
        rope_theta: float | None = None,
        qk_norm: bool = False,
        qk_norm_gain: bool = True,
        eps: float = 1e-5,
        head_dim: int | None = None,
        rope_scaling: RopeScaling | None = None,
        rotary_dim: int | None = None,
        norm_offset: float = 0.0,
        sliding_window: int | None = None,
        softcap: float | None = None,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(n_heads, int) or n_heads <= 0:
            raise LaminaError(f"n_heads must be a positive integer, got {n_heads!r}")
        if not isinstance(d_model, int) or d_model <= 0:
            raise LaminaError(f"d_model must be a positive integer, got {d_model!r}")
        if head_dim is None and d_model % n_heads:
            raise LaminaError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        for name, value in (
            ("head_dim", head_dim),
            ("rotary_dim", rotary_dim),
            ("sliding_window", sliding_window),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value <= 0
            ):
                raise LaminaError(f"{name} must be a positive integer, got {value!r}")
        for name, value in (("softcap", softcap), ("scale", scale)):
            if value is not None and not value > 0:
                raise LaminaError(f"{name} must be a positive number, got {value!r}")
        if not 0.0 <= dropout < 1.0:
            raise LaminaError(f"dropout must be in [0, 1), got {dropout!r}")
        if impl not in ("sdpa", "reference"):
            raise LaminaError(f"impl must be 'sdpa' or 'reference', got {impl!r}")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads <= 0:
            raise LaminaError(f"n_kv_heads must be a positive integer, got {n_kv_heads!r}")
        if n_heads % n_kv_heads:
            raise LaminaError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        hd = d_model // n_heads if head_dim is None else head_dim
        rd = hd if rotary_dim is None else rotary_dim
        if rope_theta is not None:
            if not rope_theta > 0:
                raise LaminaError(f"rope_theta must be positive, got {rope_theta!r}")
            if rd % 2 or rd > hd:
                what = "head dimension" if rotary_dim is None else f"rotary_dim (<= {hd})"
                raise LaminaError(f"rotary positions need an even {what}, got {rd}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, hd
        self.n_kv_heads, self.rope_theta, self.eps = n_kv_heads, rope_theta, eps
        self.rope_scaling, self.rotary_dim = rope_scaling, rd
        self.dropout, self.causal, self.impl = dropout, causal, impl
        self.sliding_window, self.softcap = sliding_window, softcap
        self.scale = 1.0 / math.sqrt(hd) if scale is None else float(scale)
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * hd, bias=qkv_bias)
        self.proj = nn.Linear(n_heads * hd, d_model, bias=bias)
        self.qk_norm, self.norm_offset = qk_norm, float(norm_offset)
        gain = qk_norm and qk_norm_gain
        init = 1.0 - self.norm_offset  # the gain a fresh norm applies is 1
        self.q_gain = nn.Parameter(torch.full((hd,), init)) if gain else None
        self.k_gain = nn.Parameter(torch.full((hd,), init)) if gain else None

    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
        rope: RopeArg | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, d) -> (output (B, T, d), weights (B, H, T, T_keys) or None).

        padding_mask: (B, T_keys) bool, True at pads; T_keys = T, or cached + T with a cache.
        rope: (cos, sin) from `rotary_tables` for these T tokens, (T, r) or (B, T, r); or a
            dict of them by layer kind, "full" and "sliding", from which this layer takes its own.
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise LaminaError(f"expected input (B, T, {self.d_model}), got {tuple(x.shape)}")
        B, T, _ = x.shape
        H, Hkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.qkv(x)
        window = self.sliding_window
        train_native = (  # a training step's plain causal attention: lamina.native's, if it runs
            cache is None
            and padding_mask is None
            and self.causal
            and T > 1
            and (window is None or T <= window)
            and not (need_weights or self.impl == "reference" or self.softcap is not None)
            and not (self.training and self.dropout)
            and torch.is_grad_enabled()
        )
        if train_native and not self.qk_norm and self.rope_theta is None:
            out = train_attention.packed_causal_attention(qkv, H, Hkv, hd, self.scale)
            if out is not None:
                return self.proj(out), None
        q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, Hkv, hd).transpose(1, 2)  # (B, H_kv, T, hd)
        v = v.view(B, T, Hkv, hd).transpose(1, 2)
        fused = not (need_weights or self.impl == "reference" or self.softcap is not None)
        upcast = fused and upcast_attention(q)  # bf16 training on a CPU: fp32 attention is faster
        dtype = q.dtype
        if upcast and cache is None:  # cast once, so the norms and rotations run in fp32 too
            q, k, v = q.float(), k.float(), v.float()
        if self.qk_norm:
            q = rms_norm(q, self.q_gain, self.eps, self.norm_offset)
            k = rms_norm(k, self.k_gain, self.eps, self.norm_offset)
        if self.rope_theta is not None:
            if isinstance(rope, dict):
                rope = rope["sliding" if self.sliding_window is not None else "full"]
            if rope is None:
                start = cache.pos if cache is not None else 0
                positions = torch.arange(start, start + T, device=x.device)
                rope = rotary_tables(positions, self.rotary_dim, self.rope_theta, self.rope_scaling)
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H_kv, T_keys, hd)
        t_k = k.shape[2]
        if padding_mask is not None:
            if padding_mask.dtype != torch.bool:
                raise LaminaError(
                    f"padding_mask must be a bool tensor, got dtype {padding_mask.dtype}"
                )
            if tuple(padding_mask.shape) != (B, t_k):
                raise LaminaError(
                    f"padding_mask must have shape (B, T_keys) = {(B, t_k)}, "
                    f"got {tuple(padding_mask.shape)}"
                )
        plain_causal = window is None or t_k <= window
        causal_only = fused and self.causal and padding_mask is None and plain_causal and T > 1
        p = self.dropout if self.training else 0.0
        if causal_only and not p and not upcast:  # a prompt: lamina.native's attention, if it runs
            out = causal_attention(q, k, v, self.scale)  # (B, T, H hd), or None
            if out is not None:
                return self.proj(out), None
        if train_native:  # after norms or rotary positions (in fp32 where upcast)
            out = train_attention.causal_attention(q, k, v, self.scale)
            if out is not None:
                return self.proj(out.to(dtype)), None
        use_causal_flag = causal_only and t_k == T  # the fused kernel's own mask: none is built
        allowed = None
        if not use_causal_flag:
            allowed = attention_mask(
                T,
                t_k,
                causal=self.causal,
                padding_mask=padding_mask,
                device=x.device,
                window=window,
            )
        dead = None  # queries with no key to attend to: computed on everything, then zeroed
        if padding_mask is not None:
            dead = ~allowed.any(-1, keepdim=True)  # (B, 1, T, 1)
            allowed = allowed | dead
        if not fused:
            if Hkv != H:  # each key/value head serves H / H_kv consecutive query heads
                k = k.repeat_interleave(H // Hkv, dim=1)
                v = v.repeat_interleave(H // Hkv, dim=1)
            scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, T, T_keys)
            if self.softcap is not None:
                scores = torch.tanh(scores / self.softcap) * self.softcap
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            weights = torch.softmax(scores, dim=-1)
            if dead is not None:
                weights = weights.masked_fill(dead, 0.0)
            out = F.dropout(weights, p, training=True) @ v if p > 0 else weights @ v
        else:
            weights = None
            kw = dict(dropout_p=p, is_causal=use_causal_flag, scale=self.scale, enable_gqa=Hkv != H)
            if upcast:
                with torch.autocast("cpu", enabled=False):
                    out = F.scaled_dot_product_attention(
                        q.float(), k.float(), v.float(), attn_mask=allowed, **kw
                    ).to(dtype)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, **kw)
            if dead is not None:
                out = out.masked_fill(dead, 0.0)
        out = out.transpose(1, 2).reshape(B, T, H * hd)  # (B, T, H*hd)
        return self.proj(out), (weights if need_weights else None)

"""Layer 2, attention: multi-head self-attention with masks, optional weights and a KV cache.

    x (B, T, d) -> qkv = x @ W_qkv (one fused projection, [q | k | v] along the output)
    q, k, v (B, H, T, d/H) -> softmax(q k^T / sqrt(d/H) + mask) v -> (B, T, d) -> output projection

Masks:
  * causal (a constructor flag): query i sees keys 0..i (shifted by the cache position);
  * padding_mask (B, T_keys) bool, True at pads: no query attends to a pad key.
  A query that may see no key at all (a fully padded row) outputs exactly zero, never NaN.

Two paths compute the same thing (a test proves it): the reference path writes the softmax out
and can return the attention weights (B, H, T_q, T_k); the fast path calls
`F.scaled_dot_product_attention`. `need_weights=True` always takes the reference path.
Attention dropout is applied only in training mode, on both paths.

`KVCache` is a preallocated (B, H, max_len, d/H) store with an explicit position: each forward
with a cache writes its keys and values at the current position and attends to everything stored.

Deliberately unaware of embeddings, blocks and models: it sees vectors, never token ids.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.errors import LaminaError

AttentionImpl = Literal["sdpa", "reference"]


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
) -> Tensor | None:
    """Boolean (B or 1, 1, t_q, t_k) mask, True where a query may attend; None if all may.

    Queries are the last t_q of the t_k positions (a cache holds the first t_k - t_q).
    """
    allowed = None
    if causal and t_q > 1:
        q_pos = torch.arange(t_k - t_q, t_k, device=device)[:, None]
        allowed = (torch.arange(t_k, device=device)[None, :] <= q_pos)[None, None]
    if padding_mask is not None:
        keep = ~padding_mask[:, None, None, :]
        allowed = keep if allowed is None else allowed & keep
    return allowed


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection.

    Args:
        d_model: width in and out; must be divisible by n_heads.
        n_heads: number of heads.
        dropout: dropout on the attention weights (training mode only).
        causal: mask future keys.
        qkv_bias: bias on the QKV projection (GPT-2 has one; the seed notebook does not).
        bias: bias on the output projection.
        impl: "sdpa" (fast path) or "reference" (explicit softmax); settable later.
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
    ) -> None:
        super().__init__()
        if not isinstance(n_heads, int) or n_heads <= 0:
            raise LaminaError(f"n_heads must be a positive integer, got {n_heads!r}")
        if not isinstance(d_model, int) or d_model <= 0:
            raise LaminaError(f"d_model must be a positive integer, got {d_model!r}")
        if d_model % n_heads:
            raise LaminaError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if not 0.0 <= dropout < 1.0:
            raise LaminaError(f"dropout must be in [0, 1), got {dropout!r}")
        if impl not in ("sdpa", "reference"):
            raise LaminaError(f"impl must be 'sdpa' or 'reference', got {impl!r}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout, self.causal, self.impl = dropout, causal, impl
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=qkv_bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, d) -> (output (B, T, d), weights (B, H, T, T_keys) or None).

        padding_mask: (B, T_keys) bool, True at pads; T_keys = T, or cached + T with a cache.
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise LaminaError(f"expected input (B, T, {self.d_model}), got {tuple(x.shape)}")
        B, T, d = x.shape
        H, hd = self.n_heads, self.head_dim
        q, k, v = self.qkv(x).view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4)  # each (B, H, T, hd)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, T_keys, hd)
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
        allowed = attention_mask(
            T, t_k, causal=self.causal, padding_mask=padding_mask, device=x.device
        )
        dead = None  # queries with no key to attend to: computed on everything, then zeroed
        if padding_mask is not None:
            dead = ~allowed.any(-1, keepdim=True)  # (B, 1, T, 1)
            allowed = allowed | dead
        p = self.dropout if self.training else 0.0
        if need_weights or self.impl == "reference":
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, H, T, T_keys)
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            weights = torch.softmax(scores, dim=-1)
            if dead is not None:
                weights = weights.masked_fill(dead, 0.0)
            out = F.dropout(weights, p, training=True) @ v if p > 0 else weights @ v
        else:
            weights = None
            use_causal_flag = (
                self.causal and allowed is not None and padding_mask is None and t_k == T
            )
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=None if use_causal_flag else allowed,
                dropout_p=p,
                is_causal=use_causal_flag,
            )
            if dead is not None:
                out = out.masked_fill(dead, 0.0)
        out = out.transpose(1, 2).reshape(B, T, d)  # (B, T, H*hd)
        return self.proj(out), (weights if need_weights else None)

"""Layer 3, block: LayerNorm, GELU, feed-forward and the residual Transformer block.

    pre-LN  (norm_first=True, GPT-2):  x = x + drop(attn(norm1(x)));  x = x + drop(ff(norm2(x)))
    post-LN (norm_first=False, 2017):  x = norm1(x + drop(attn(x)));  x = norm2(x + drop(ff(x)))

Shapes: (B, T, d) -> (B, T, d). The feed-forward acts on each position alone: d -> d_ff -> d.
LayerNorm uses the biased variance and eps 1e-5; GELU is the tanh approximation GPT-2 uses.
Both run through torch's fused kernels; tests pin them to the written-out formulas.

Deliberately unaware of token ids, positions and models: a block maps vectors to vectors.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.attention import KVCache, MultiHeadAttention
from lamina.errors import LaminaError

Activation = Literal["gelu", "relu"]


class LayerNorm(nn.Module):
    """y = weight * (x - mean) / sqrt(var + eps) + bias over the last dim (biased variance)."""

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        if not isinstance(d_model, int) or d_model <= 0:
            raise LaminaError(f"d_model must be a positive integer, got {d_model!r}")
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


def gelu_formula(x: Tensor) -> Tensor:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), written out (the reference)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


class GELU(nn.Module):
    """GELU, tanh approximation (as GPT-2)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, approximate="tanh")


def activation_module(name: Activation) -> nn.Module:
    if name == "gelu":
        return GELU()
    if name == "relu":
        return nn.ReLU()
    raise LaminaError(f"activation must be 'gelu' or 'relu', got {name!r}")


class FeedForward(nn.Module):
    """Position-wise d -> d_ff -> d with GELU or ReLU (d_ff defaults to 4 d)."""

    def __init__(
        self,
        d_model: int,
        d_ff: int | None = None,
        *,
        activation: Activation = "gelu",
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        d_ff = 4 * d_model if d_ff is None else d_ff
        if not isinstance(d_ff, int) or d_ff <= 0:
            raise LaminaError(f"d_ff must be a positive integer, got {d_ff!r}")
        self.fc = nn.Linear(d_model, d_ff, bias=bias)
        self.act = activation_module(activation)
        self.drop = nn.Dropout(dropout)
        self.proj = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.drop(self.act(self.fc(x))))


class TransformerBlock(nn.Module):
    """Attention and feed-forward sublayers, each wrapped in a residual connection.

    Args:
        d_model, n_heads: width and heads of the attention.
        d_ff: hidden width of the feed-forward (default 4 d_model).
        dropout: residual dropout, attention-weight dropout and feed-forward hidden dropout.
        norm_first: pre-LN (True, GPT-2) or post-LN (False, the 2017 Transformer).
        causal: mask future positions in the attention.
        activation: "gelu" or "relu".
        qkv_bias, bias: biases of the QKV projection and of the other linear layers.
        eps: LayerNorm epsilon.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        d_ff: int | None = None,
        dropout: float = 0.0,
        norm_first: bool = True,
        causal: bool = True,
        activation: Activation = "gelu",
        qkv_bias: bool = True,
        bias: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.attn = MultiHeadAttention(
            d_model, n_heads, dropout=dropout, causal=causal, qkv_bias=qkv_bias, bias=bias
        )
        self.ff = FeedForward(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        self.norm1 = LayerNorm(d_model, eps, bias)
        self.norm2 = LayerNorm(d_model, eps, bias)
        self.drop1 = nn.Dropout(dropout)
        self.drop2 = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, d) -> (x (B, T, d), attention weights (B, H, T, T_keys) or None)."""
        if self.norm_first:
            a, w = self.attn(self.norm1(x), padding_mask, need_weights, cache)
            x = x + self.drop1(a)
            x = x + self.drop2(self.ff(self.norm2(x)))
        else:
            a, w = self.attn(x, padding_mask, need_weights, cache)
            x = self.norm1(x + self.drop1(a))
            x = self.norm2(x + self.drop2(self.ff(x)))
        return x, w

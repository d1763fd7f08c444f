"""Layer 5, block: LayerNorm / RMSNorm, activations, feed-forward and the residual block.

    pre-LN  (norm_first=True, GPT-2):  x = x + drop(attn(norm1(x)));  x = x + drop(ff(norm2(x)))
    post-LN (norm_first=False, 2017):  x = norm1(x + drop(attn(x)));  x = norm2(x + drop(ff(x)))
    sandwich (pre-LN, Gemma 2/3):      x = x + drop(post_attn_norm(attn(norm1(x))));
                                       x = x + drop(post_ff_norm(ff(norm2(x))))

Shapes: (B, T, d) -> (B, T, d). The feed-forward acts on each position alone: d -> d_ff -> d,
with GELU (tanh approximation, GPT-2; "gelu_exact": the erf form, nanoGPT's), ReLU, ReLU²
(relu(x)^2), SwiGLU or GeGLU. SwiGLU is gated, in the Llama convention: silu(x W_gate) *
(x W_up) -> W_down, where d_ff is the width of each of the two input projections; they are
stored as one fused (2 d_ff, d) matrix, [gate | up].
GeGLU (Gemma) is the same with GELU's tanh approximation in place of silu.
LayerNorm uses the biased variance; RMSNorm divides by the root mean square without centring
(`F.rms_norm`); either may drop its learnable gain. An RMSNorm with an offset (Gemma: 1) applies
the gain as (offset + weight), in float32 (`attention.rms_norm`). All run through torch's fused
kernels; tests pin them to the written-out formulas and to transformers' modules.

Deliberately unaware of token ids, positions and models: a block maps vectors to vectors.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.attention import KVCache, MultiHeadAttention, RopeArg, RopeScaling, rms_norm
from lamina.errors import LaminaError

Activation = Literal["gelu", "gelu_exact", "relu", "relu2", "swiglu", "geglu"]
ACTIVATIONS: tuple[str, ...] = get_args(Activation)
GATED = ("swiglu", "geglu")  # activations whose input is [gate | up], 2 d_ff wide
NormKind = Literal["layer", "rms"]


class LayerNorm(nn.Module):
    """y = weight * (x - mean) / sqrt(var + eps) + bias over the last dim (biased variance)."""

    def __init__(
        self, d_model: int, eps: float = 1e-5, bias: bool = True, gain: bool = True
    ) -> None:
        super().__init__()
        if not isinstance(d_model, int) or d_model <= 0:
            raise LaminaError(f"d_model must be a positive integer, got {d_model!r}")
        self.eps, self.d_model = eps, d_model
        self.weight = nn.Parameter(torch.ones(d_model)) if gain else None
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, (self.d_model,), self.weight, self.bias, self.eps)


def rms_norm_formula(x: Tensor, eps: float = 1e-5) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, written out (the reference)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """y = weight * x / sqrt(mean(x^2) + eps) over the last dim: no centring, no shift.

    offset: the gain is (offset + weight), computed in float32 (Gemma's `1 + weight`); a fresh
    weight is 1 - offset, so a fresh norm's gain is 1 either way.
    """

    def __init__(
        self, d_model: int, eps: float = 1e-5, gain: bool = True, offset: float = 0.0
    ) -> None:
        super().__init__()
        if not isinstance(d_model, int) or d_model <= 0:
            raise LaminaError(f"d_model must be a positive integer, got {d_model!r}")
        self.eps, self.d_model, self.offset = eps, d_model, float(offset)
        init = torch.full((d_model,), 1.0 - self.offset)
        self.weight = nn.Parameter(init) if gain else None

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps, self.offset)


def norm_module(
    kind: NormKind,
    d_model: int,
    eps: float = 1e-5,
    bias: bool = True,
    gain: bool = True,
    offset: float = 0.0,
) -> nn.Module:
    """A LayerNorm (with a shift when `bias`) or an RMSNorm (never a shift; gains offset by
    `offset`, which a LayerNorm refuses)."""
    if kind == "layer":
        if offset:
            raise LaminaError(f"norm_offset needs norm='rms', got norm='layer' with {offset}")
        return LayerNorm(d_model, eps, bias, gain)
    if kind == "rms":
        return RMSNorm(d_model, eps, gain, offset)
    raise LaminaError(f"norm must be 'layer' or 'rms', got {kind!r}")


def gelu_formula(x: Tensor) -> Tensor:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), written out (the reference)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


class GELU(nn.Module):
    """GELU, tanh approximation (as GPT-2)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, approximate="tanh")


class ReLU2(nn.Module):
    """ReLU squared: relu(x)^2 (Primer; modded-nanoGPT)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x).square()


class SwiGLU(nn.Module):
    """The gate of a gated feed-forward: input (..., 2 f) = [gate | up] -> silu(gate) * up."""

    def forward(self, x: Tensor) -> Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class GeGLU(nn.Module):
    """[gate | up] -> gelu_tanh(gate) * up (Gemma's gelu_pytorch_tanh gate)."""

    def forward(self, x: Tensor) -> Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


def activation_module(name: Activation) -> nn.Module:
    if name == "gelu":
        return GELU()
    if name == "gelu_exact":
        return nn.GELU()  # the erf form
    if name == "relu":
        return nn.ReLU()
    if name == "relu2":
        return ReLU2()
    if name == "swiglu":
        return SwiGLU()
    if name == "geglu":
        return GeGLU()
    raise LaminaError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}")


class FeedForward(nn.Module):
    """Position-wise d -> d_ff -> d (d_ff defaults to 4 d); with "swiglu" or "geglu", `fc` is the
    fused [gate | up] projection d -> 2 d_ff and the gate halves it back to d_ff."""

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
        gated = activation in GATED
        self.fc = nn.Linear(d_model, 2 * d_ff if gated else d_ff, bias=bias)
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
        attn_dropout: the attention-weight dropout alone (None: `dropout`).
        norm_first: pre-LN (True, GPT-2) or post-LN (False, the 2017 Transformer).
        causal: mask future positions in the attention.
        activation: "gelu", "relu", "relu2", "swiglu" or "geglu".
        qkv_bias, bias: biases of the QKV projection and of the other linear layers (and the
            LayerNorms' shift).
        eps: the norms' epsilon.
        norm: "layer" (LayerNorm) or "rms" (RMSNorm); norm_gain: learnable gains on the norms.
        norm_offset: RMSNorm gains are (norm_offset + weight), the qk norms' too (Gemma: 1).
        sandwich_norm: norms on the attention and feed-forward outputs before each residual
            add (`post_attn_norm`, `post_ff_norm`; pre-LN only).
        n_kv_heads, rope_theta, qk_norm, head_dim, rope_scaling, rotary_dim, sliding_window,
            attn_softcap (its softcap), attn_scale (its scale): passed to `MultiHeadAttention`.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        d_ff: int | None = None,
        dropout: float = 0.0,
        attn_dropout: float | None = None,
        norm_first: bool = True,
        causal: bool = True,
        activation: Activation = "gelu",
        qkv_bias: bool = True,
        bias: bool = True,
        eps: float = 1e-5,
        norm: NormKind = "layer",
        norm_gain: bool = True,
        n_kv_heads: int | None = None,
        rope_theta: float | None = None,
        qk_norm: bool = False,
        head_dim: int | None = None,
        rope_scaling: RopeScaling | None = None,
        rotary_dim: int | None = None,
        norm_offset: float = 0.0,
        sandwich_norm: bool = False,
        sliding_window: int | None = None,
        attn_softcap: float | None = None,
        attn_scale: float | None = None,
    ) -> None:
        super().__init__()
        if sandwich_norm and not norm_first:
            raise LaminaError("sandwich_norm needs pre-LN blocks (norm_first=True)")
        self.norm_first = norm_first
        self.attn = MultiHeadAttention(
            d_model,
            n_heads,
            dropout=dropout if attn_dropout is None else attn_dropout,
            causal=causal,
            qkv_bias=qkv_bias,
            bias=bias,
            n_kv_heads=n_kv_heads,
            rope_theta=rope_theta,
            qk_norm=qk_norm,
            qk_norm_gain=norm_gain,
            eps=eps,
            head_dim=head_dim,
            rope_scaling=rope_scaling,
            rotary_dim=rotary_dim,
            norm_offset=norm_offset,
            sliding_window=sliding_window,
            softcap=attn_softcap,
            scale=attn_scale,
        )
        self.ff = FeedForward(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        self.norm1 = norm_module(norm, d_model, eps, bias, norm_gain, norm_offset)
        self.norm2 = norm_module(norm, d_model, eps, bias, norm_gain, norm_offset)
        self.post_attn_norm = self.post_ff_norm = None
        if sandwich_norm:
            self.post_attn_norm = norm_module(norm, d_model, eps, bias, norm_gain, norm_offset)
            self.post_ff_norm = norm_module(norm, d_model, eps, bias, norm_gain, norm_offset)
        self.drop1 = nn.Dropout(dropout)
        self.drop2 = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        padding_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
        rope: RopeArg | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, d) -> (x (B, T, d), attention weights (B, H, T, T_keys) or None).

        rope: the rotary tables of these positions (see `rope.rotary_tables`), if any.
        """
        if self.norm_first:
            a, w = self.attn(self.norm1(x), padding_mask, need_weights, cache, rope)
            if self.post_attn_norm is not None:
                a = self.post_attn_norm(a)
            x = x + self.drop1(a)
            h = self.ff(self.norm2(x))
            if self.post_ff_norm is not None:
                h = self.post_ff_norm(h)
            x = x + self.drop2(h)
        else:
            a, w = self.attn(x, padding_mask, need_weights, cache, rope)
            x = self.norm1(x + self.drop1(a))
            x = self.norm2(x + self.drop2(self.ff(x)))
        return x, w

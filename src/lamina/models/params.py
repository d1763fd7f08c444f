"""Layer 6, parameter counts: by formula, by component, and on the meta device.

The formula for a GPT with width d, feed-forward width f, vocabulary V, context n, L layers,
H heads of width h (d / H unless d_head sets it) and H_kv key/value heads:

    embeddings  V d + n d                     (no position parameters when sinusoidal or rope)
    attention   L (d (H + 2 H_kv) h + [(H + 2 H_kv) h] + H h d + [d] + <2 h>)
                                              [qkv bias], [bias], <qk-norm gains>
    feed-fwd    L (d g f + [g f] + f d + [d])  g = 2 for SwiGLU and GeGLU (gate and up), else 1
    norms       (s L + 1)(<d> + [d])           <gain>, [bias] (LayerNorm only; RMSNorm has no
                                              shift); s = 2, or 4 with sandwich norms; no final
                                              norm when post-LN
    head        V d                            (0 when tied to the token table)

`count_params(config)` must equal the parameters of the built model for every config (a test
checks a grid). `meta_model` builds a model on PyTorch's meta device: shapes, no memory.
"""

from __future__ import annotations

import torch
from torch import nn

from lamina.errors import LaminaError
from lamina.models.config import EncoderConfig, GPTConfig


def gpt_param_table(config: GPTConfig, tied: bool | None = None) -> dict[str, int]:
    """Parameters of a GPT by component: token/position embeddings, attention, feed-forward,
    norms, head (0 when tied)."""
    c = config
    tied = c.tie_weights if tied is None else tied
    d, f, L, b = c.d_model, c.ff_width, c.n_layers, int(c.bias)
    gain = int(c.norm_gain)
    norm = gain * d + (b * d if c.norm == "layer" else 0)
    qkv = (c.n_heads + 2 * c.kv_heads) * c.head_dim  # output width of the fused projection
    qk_norm = 2 * c.head_dim * gain if c.qk_norm else 0
    g = 2 if c.gated else 1
    per_layer = 4 if c.sandwich_norm else 2  # norm1, norm2 [, post_attn_norm, post_ff_norm]
    return {
        "token embedding": c.vocab_size * d,
        "position embedding": c.block_size * d if c.positions == "learned" else 0,
        "attention": L
        * (d * qkv + int(c.qkv_bias) * qkv + c.n_heads * c.head_dim * d + b * d + qk_norm),
        "feed-forward": L * (d * g * f + b * g * f + f * d + b * d),
        "norms": (per_layer * L + int(c.norm_first)) * norm,
        "head": 0 if tied else c.vocab_size * d,
    }


def encoder_param_table(config: EncoderConfig) -> dict[str, int]:
    """Parameters of an Encoder by component (the classifier on top is not included)."""
    c = config
    d, f, L = c.d_model, c.d_ff, c.n_layers
    return {
        "token embedding": c.vocab_size * d,
        "position embedding": 0,
        "attention": L * (4 * d * d + 4 * d),
        "feed-forward": L * (2 * d * f + f + d),
        "norms": (2 * L + int(c.norm_first)) * 2 * d,
        "head": 0,
    }


def count_params(config: GPTConfig | EncoderConfig, tied: bool | None = None) -> int:
    """Number of parameters by formula (shared tensors counted once).

    tied: for a GPT, count the head as tied (True) or separate (False); default: the config's.
    """
    if isinstance(config, GPTConfig):
        return sum(gpt_param_table(config, tied).values())
    if isinstance(config, EncoderConfig):
        if tied is not None:
            raise LaminaError("an encoder has no head to tie; leave tied=None")
        return sum(encoder_param_table(config).values())
    raise LaminaError(
        f"count_params needs a GPTConfig or EncoderConfig, got {type(config).__name__}"
    )


def count_module_params(module: nn.Module) -> int:
    """Parameters of a built module, each shared tensor counted once (works on meta tensors)."""
    return sum(p.numel() for p in module.parameters())


def meta_model(config: GPTConfig | EncoderConfig) -> nn.Module:
    """Build the model on the meta device: real parameter shapes, no memory allocated."""
    from lamina.models.encoder import Encoder
    from lamina.models.gpt import GPT

    with torch.device("meta"):
        return GPT(config) if isinstance(config, GPTConfig) else Encoder(config)

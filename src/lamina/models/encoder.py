"""Layer 6, encoder: a bidirectional Transformer encoder and a sequence classifier on top.

    ids (B, T) -> token table (pad row zero) * sqrt(d) + positions (sinusoidal or learned)
               -> dropout
               -> n_layers x TransformerBlock(causal=False) -> final norm if pre-LN
               -> hidden (B, T, d)
    SequenceClassifier: hidden -> pool (first token, mean over real tokens, or last real token)
               -> Linear(d, n_classes) -> logits (B, n_classes)

`padding_mask` is (B, T) bool, True at pads; no query attends to a pad. Weights start as in the
seed encoder: Xavier-uniform for matrices, zero biases, the pad row zero.

`Encoder.forward_packed(ids, padding_mask)` computes the same states for the real tokens while
running every position-wise part (projections, feed-forward, norms) on the N real tokens only,
packed as (N, d); only the attention scores see the padded (B, T) layout. The pads' states are
zero. With padded batches (texts of mixed length) this skips most of the work on pads; the
classifier uses it whenever a batch has pads.

Deliberately unaware of tokenizers, tasks and training.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.block import LayerNorm, TransformerBlock
from lamina.embedding import Embedding
from lamina.errors import LaminaError
from lamina.models.config import EncoderConfig

Pooling = Literal["first", "mean", "last"]


class Encoder(nn.Module):
    """`Encoder(config)(ids, padding_mask)` -> hidden states (B, T, d_model)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        if not isinstance(config, EncoderConfig):
            raise LaminaError(f"Encoder needs an EncoderConfig, got {type(config).__name__}")
        c = self.config = config
        self.embed = Embedding(
            c.vocab_size,
            c.max_len,
            c.d_model,
            dropout=c.dropout,
            positions=c.positions,
            scale=True,
            padding_idx=c.pad_id,
        )
        self.layers = nn.ModuleList(
            TransformerBlock(
                c.d_model,
                c.n_heads,
                d_ff=c.d_ff,
                dropout=c.dropout,
                norm_first=c.norm_first,
                causal=False,
                activation=c.activation,
            )
            for _ in range(c.n_layers)
        )
        self.norm_f = LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        for m in self.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        with torch.no_grad():
            self.embed.wte.weight[self.config.pad_id].zero_()

    def forward(
        self, ids: Tensor, padding_mask: Tensor | None = None, *, return_weights: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """ids (B, T) -> hidden (B, T, d); with return_weights also each layer's (B, H, T, T)."""
        x = self.embed(ids)
        weights: list[Tensor] = []
        for layer in self.layers:
            x, w = layer(x, padding_mask, return_weights)
            if w is not None:
                weights.append(w)
        x = self.norm_f(x)
        return (x, weights) if return_weights else x

    @property
    def packable(self) -> bool:
        """Whether `forward_packed` applies: plain multi-head attention in every layer."""
        return all(
            getattr(b.attn, "n_kv_heads", b.attn.n_heads) == b.attn.n_heads
            and getattr(b.attn, "rope_theta", None) is None
            and not getattr(b.attn, "qk_norm", False)
            for b in self.layers
        )

    def forward_packed(self, ids: Tensor, padding_mask: Tensor) -> Tensor:
        """ids (B, T), padding_mask (B, T) -> hidden (B, T, d): real tokens as `forward`, pads 0.

        Every row needs at least one real token (use `forward` otherwise).
        """
        B, T = ids.shape
        flat = ~padding_mask.reshape(-1)
        idx = flat.nonzero().squeeze(1)  # (N,) flat positions of the real tokens
        pads = (~flat).nonzero().squeeze(1)
        rows, cols = idx // T, idx % T
        x = self.embed(ids[rows, cols][None], positions=cols[None])[0]  # (N, d)
        where = (idx, pads, rows, cols, B, T, ~padding_mask[:, None, None, :])
        for layer in self.layers:
            if layer.norm_first:
                x = x + layer.drop1(self._attend(layer.attn, layer.norm1(x), where))
                x = x + layer.drop2(layer.ff(layer.norm2(x)))
            else:
                x = layer.norm1(x + layer.drop1(self._attend(layer.attn, x, where)))
                x = layer.norm2(x + layer.drop2(layer.ff(x)))
        x = self.norm_f(x)
        return x.new_zeros(B * T, x.shape[-1]).index_copy(0, idx, x).view(B, T, -1)

    @staticmethod
    def _attend(attn: nn.Module, x: Tensor, where: tuple) -> Tensor:
        """Packed (N, d) -> the attention sublayer's packed (N, d) output.

        q, k, v go to the padded layout (zeros at pads, so masked keys stay finite), attention
        runs there, and the real queries' outputs are gathered straight back to (N, H, hd).
        """
        idx, pads, rows, cols, B, T, allowed = where
        H, hd = attn.n_heads, attn.head_dim
        qkv = attn.qkv(x)  # (N, 3d)
        full = qkv.new_empty(B * T, qkv.shape[-1]).index_fill_(0, pads, 0.0)
        full = full.index_copy_(0, idx, qkv)
        q, k, v = full.view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4)  # each (B, H, T, hd)
        p = attn.dropout if attn.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p)
        return attn.proj(out[rows, :, cols].reshape(-1, H * hd))  # (N, H, hd) -> (N, d)


class SequenceClassifier(nn.Module):
    """An encoder whose pooled hidden state feeds a linear classifier.

    pooling: "first" (the first token's state, as in the seed), "mean" (over real tokens only)
    or "last" (the last real token, never a pad). Without a padding_mask, pads are the tokens
    equal to the config's pad_id.
    """

    def __init__(
        self, config: EncoderConfig, n_classes: int = 2, pooling: Pooling = "first"
    ) -> None:
        super().__init__()
        if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 2:
            raise LaminaError(f"n_classes must be an integer >= 2, got {n_classes!r}")
        if pooling not in ("first", "mean", "last"):
            raise LaminaError(f"pooling must be 'first', 'mean' or 'last', got {pooling!r}")
        self.config, self.pooling = config, pooling
        self.labels: list[str] | None = None  # class names, index = class id (saved as labels.json)
        self.encoder = Encoder(config)
        self.classifier = nn.Linear(config.d_model, n_classes)

    def forward(self, ids: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """ids (B, T) -> class logits (B, n_classes)."""
        if padding_mask is None:
            padding_mask = ids.eq(self.config.pad_id) if isinstance(ids, Tensor) else None
        if isinstance(padding_mask, Tensor) and padding_mask.dtype == torch.bool:
            if padding_mask.shape == ids.shape and not padding_mask.any():
                padding_mask = None  # no pads: nothing to mask
        packable = (
            self.encoder.packable
            and isinstance(padding_mask, Tensor)
            and padding_mask.dtype == torch.bool
            and padding_mask.shape == ids.shape
            and bool(padding_mask.any())
            and bool((~padding_mask).any(1).all())  # every row has a real token
        )
        if packable:
            h = self.encoder.forward_packed(ids, padding_mask)
        else:
            h = self.encoder(ids, padding_mask)
        if self.pooling == "first" or padding_mask is None and self.pooling == "last":
            pooled = h[:, 0] if self.pooling == "first" else h[:, -1]
        elif self.pooling == "mean":
            if padding_mask is None:
                pooled = h.mean(1)
            else:
                real = (~padding_mask).unsqueeze(-1).to(h.dtype)
                pooled = (h * real).sum(1) / real.sum(1).clamp(min=1.0)
        else:  # the last real token, wherever the padding is (left or right)
            last = h.shape[1] - 1 - (~padding_mask).flip(1).long().argmax(1)
            pooled = h[torch.arange(h.shape[0], device=h.device), last]
        return self.classifier(pooled)

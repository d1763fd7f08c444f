"""Layer 6, GPT: a decoder-only language model (GPT-2 layout; Llama's layers as options).

    ids (B, T) -> Embedding (token [* embed_scale] [+ position]) -> n_layers x causal
               TransformerBlock -> final norm -> head Linear(d, vocab, bias=False)
               -> logits (B, T, vocab) [-> cap * tanh(logits / cap) with `logit_softcap`]

With positions="rope" the embedding has no position table: the positions (the same ones a
table would have used) become rotary tables, computed once per forward and shared by every
layer's attention (with `rope_local_theta`, a second set for the sliding layers). Layer i's
attention is "full" or "sliding" (`GPTConfig.attention_kinds`): a sliding one sees only the
last `sliding_window` keys; every layer gets the config's soft cap, scale, norm offset,
sandwich norms and partial rotary. The head shares the token table when `tie_weights` (stored once, counted
once). Weights start as GPT-2's: normal(0, init_std), residual output projections scaled by
1/sqrt(2 * n_layers) (or zero with `zero_init_proj`), biases zero. `forward` also takes per-layer KV caches (positions then continue from the cache),
a key-padding mask and explicit positions, which batched generation needs; `greedy` is the
seed notebook's crop-to-block_size greedy decoder, kept as the simple reference.

Deliberately unaware of tokenizers, training and sampling strategies.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lamina.attention import KVCache, RopeArg
from lamina.block import TransformerBlock, norm_module
from lamina.bounds import check_fits
from lamina.embedding import Embedding, check_ids
from lamina.errors import LaminaError
from lamina.models.config import GPTConfig
from lamina.modes import eval_mode
from lamina.rope import rotary_tables


class GPT(nn.Module):
    """A GPT decoder with an LM head. `GPT(config)(ids)` -> logits (B, T, vocab_size)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise LaminaError(f"GPT needs a GPTConfig, got {type(config).__name__}")
        c = self.config = config
        self.embed = Embedding(
            c.vocab_size,
            c.block_size,
            c.d_model,
            dropout=c.dropout,
            positions="none" if c.positions == "rope" else c.positions,
            init_std=c.init_std,
            scale=c.embed_scale or False,
        )
        self.blocks = nn.ModuleList(self._block(kind) for kind in c.attention_kinds)
        # post-LN blocks already end in a norm; pre-LN needs a final one (GPT-2's ln_f)
        self.norm_f = (
            norm_module(c.norm, c.d_model, c.layer_norm_eps, c.bias, c.norm_gain, c.norm_offset)
            if c.norm_first
            else nn.Identity()
        )
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.reset_parameters()
        if c.tie_weights:
            self.embed.tie_lm_head(self.head)

    def _block(self, kind: str) -> TransformerBlock:
        """One layer; `kind` "sliding" gives it the window (and the local rotary base)."""
        c = self.config
        sliding = kind == "sliding"
        local = sliding and c.rope_local_theta is not None
        return TransformerBlock(
            c.d_model,
            c.n_heads,
            d_ff=c.ff_width,
            dropout=c.dropout,
            attn_dropout=c.attn_dropout,
            norm_first=c.norm_first,
            causal=True,
            activation=c.activation,
            qkv_bias=c.qkv_bias,
            bias=c.bias,
            eps=c.layer_norm_eps,
            norm=c.norm,
            norm_gain=c.norm_gain,
            n_kv_heads=c.n_kv_heads,
            rope_theta=(c.rope_local_theta if local else c.rope_theta)
            if c.positions == "rope"
            else None,
            qk_norm=c.qk_norm,
            head_dim=c.d_head,
            rope_scaling=None if local else c.rope_scaling,
            rotary_dim=c.rotary_dim,
            norm_offset=c.norm_offset,
            sandwich_norm=c.sandwich_norm,
            sliding_window=c.sliding_window if sliding else None,
            attn_softcap=c.attn_softcap,
            attn_scale=c.attn_scale,
        )

    def reset_parameters(self) -> None:
        c = self.config
        if self.head.weight.is_meta:  # built on the meta device: shapes only, nothing to draw
            return
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                residual = name.endswith(".proj")  # attn.proj and ff.proj write the stream
                scale = 1.0 / math.sqrt(2 * c.n_layers) if residual else 1.0
                if residual and c.zero_init_proj:
                    nn.init.zeros_(module.weight)
                else:
                    nn.init.normal_(module.weight, mean=0.0, std=c.init_std * scale)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        self.embed.reset_parameters()

    def set_attention_impl(self, impl: str) -> None:
        """Switch every attention layer to "sdpa" (fast) or "reference" (explicit softmax)."""
        if impl not in ("sdpa", "reference"):
            raise LaminaError(f"attention impl must be 'sdpa' or 'reference', got {impl!r}")
        for block in self.blocks:
            block.attn.impl = impl

    def reference_tensor(self) -> Tensor:
        """A float tensor whose device and dtype the activations (and KV caches) take: the
        head's weight, or, where the head has none (a quantized head), the first float
        parameter or buffer."""
        weight = getattr(self.head, "weight", None)
        if isinstance(weight, Tensor):
            return weight
        tensors = [*self.parameters(), *self.buffers()]
        return next(t for t in tensors if t.is_floating_point())

    def make_caches(
        self,
        batch_size: int,
        max_len: int | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> list[KVCache]:
        """One preallocated KV cache per layer (max_len defaults to block_size)."""
        c = self.config
        max_len = c.block_size if max_len is None else max_len
        if max_len > c.block_size:
            raise LaminaError(f"cache max_len {max_len} exceeds block_size {c.block_size}")
        ref = self.reference_tensor()
        _check_cache_fits(
            c, batch_size, max_len, torch.device(device or ref.device), dtype or ref.dtype
        )
        return [
            KVCache(
                batch_size,
                c.kv_heads,
                max_len,
                c.head_dim,
                device=device or ref.device,
                dtype=dtype or ref.dtype,
            )
            for _ in range(c.n_layers)
        ]

    def forward(
        self,
        ids: Tensor,
        padding_mask: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        caches: list[KVCache] | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """ids (B, T) -> logits (B, T, vocab), or (B, 1, vocab) with `last_only`.

        padding_mask: (B, T_keys) bool, True at pads (T_keys counts cached positions too).
        positions: explicit positions (B, T); by default they continue from the caches.
        caches: one KVCache per layer, from `make_caches`.
        """
        if caches is not None and len(caches) != len(self.blocks):
            raise LaminaError(f"expected {len(self.blocks)} KV caches, got {len(caches)}")
        offset = caches[0].pos if caches is not None else 0
        x, rope = self.embed_with_rope(ids, offset, positions)
        for i, block in enumerate(self.blocks):
            x, _ = block(x, padding_mask, False, None if caches is None else caches[i], rope)
        if last_only:
            x = x[:, -1:]
        return self.logits(x)

    def logits(self, x: Tensor) -> Tensor:
        """Final norm, head and (with `logit_softcap`) the soft cap: (B, T, d) -> (B, T, V)."""
        logits = self.head(self.norm_f(x))
        cap = self.config.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def embed_with_rope(
        self, ids: Tensor, pos_offset: int = 0, positions: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """Token (+ position) vectors and, for rotary models, the rotary tables: the positions
        are computed and checked once for both."""
        check_ids(ids, self.embed.vocab_size)
        pos = self.embed.positions_for(ids.shape[1], pos_offset, positions, ids.device)
        return self.embed.embed_checked(ids, pos), self.rope_tables(pos)

    def rope_tables(self, positions: Tensor) -> RopeArg | None:
        """Rotary (cos, sin) tables for checked positions; None unless positions="rope". With
        `rope_local_theta` and sliding layers: {"full": tables, "sliding": local tables}."""
        c = self.config
        if c.positions != "rope":
            return None
        tables = rotary_tables(positions, c.rope_dim, c.rope_theta, c.rope_scaling)
        if c.rope_local_theta is None or "sliding" not in c.attention_kinds:
            return tables
        return {"full": tables, "sliding": rotary_tables(positions, c.rope_dim, c.rope_local_theta)}

    @torch.no_grad()
    def attention_weights(self, ids: Tensor, padding_mask: Tensor | None = None) -> list[Tensor]:
        """Attention weights of every layer, each (B, H, T, T), from the reference path."""
        x, rope = self.embed_with_rope(ids)
        maps = []
        for block in self.blocks:
            x, w = block(x, padding_mask, True, None, rope)
            maps.append(w)
        return maps

    @torch.no_grad()
    def greedy(self, ids: Tensor, max_new_tokens: int) -> Tensor:
        """Greedy decoding without a cache, cropping the context to block_size (the reference).

        Returns (B, T + max_new_tokens); the prompt is kept. The mode (train/eval) is restored.
        """
        if (
            isinstance(max_new_tokens, bool)
            or not isinstance(max_new_tokens, int)
            or max_new_tokens < 0
        ):
            raise LaminaError(
                f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}"
            )
        with eval_mode(self):
            for _ in range(max_new_tokens):
                logits = self(ids[:, -self.config.block_size :], last_only=True)
                ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids

    def num_params(self, *, exclude_positions: bool = False) -> int:
        """Parameters, each shared tensor counted once."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_positions and self.embed.wpe is not None:
            n -= self.embed.wpe.weight.numel()
        return n


def _check_cache_fits(
    c: GPTConfig, batch: int, max_len: int, device: torch.device, dtype: torch.dtype
) -> None:
    """Refuse KV caches that cannot fit (a GGUF may claim a 2^31-token context) before any
    allocation, naming their size."""
    if device.type not in ("cpu", "cuda") or not isinstance(batch, int) or batch <= 0:
        return  # the meta device allocates nothing; KVCache checks the numbers
    nbytes = 2 * c.n_layers * batch * c.kv_heads * max_len * c.head_dim * dtype.itemsize
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    what = f"KV caches for {batch} x {max_len:,} positions ({c.n_layers} layers)"
    check_fits(nbytes, what, free)

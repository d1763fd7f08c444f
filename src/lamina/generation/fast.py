"""A fixed-shape decode step, which `torch.compile` can turn into one graph.

    fixed_step(model, caches, tok (B, 1), index (1,), shift (B, 1)) -> logits (B, V)

The ordinary cached step attends to `cache.pos` keys, a length that grows by one per token (a
new shape each step). Here every tensor keeps its shape from step to step: the new key and
value are written at slot `index` of a `FixedKVCache`, attention reads all `max_len` slots, and
a mask hides the slots past `index` and, per row, those before `shift` (pads and tokens the
window has left behind). The token's position is `index - shift`, as the window rule says.
The caller advances `index` in place, so a compiled step sees the same tensors on every call.

It runs the model's own modules and methods (`Embedding.embed_checked`, `GPT.rope_tables`,
blocks, head), skipping only the embedding's range checks, which would break the graph (the
decoder keeps positions in range by construction). A test holds it equal to a full recompute.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lamina.attention import KVCache
from lamina.models.gpt import GPT

StepFn = Callable[[GPT, list["FixedKVCache"], Tensor, Tensor, Tensor], Tensor]


class FixedKVCache(KVCache):
    """A KVCache that, while `fixed` is set, writes at slot `index` and returns every slot.

    When `fixed` is False it behaves as a plain KVCache (prefill appends at `pos`).
    """

    def __init__(self, *args: object, index: Tensor, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.index = index  # (1,) int64, shared by every layer's cache
        self.fixed = False

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if not self.fixed:
            return super().append(k, v)
        self.k.index_copy_(2, self.index, k)  # (B, H, max_len, hd); k is (B, H, 1, hd)
        self.v.index_copy_(2, self.index, v)
        return self.k, self.v


def fixed_caches(
    model: GPT, batch_size: int, max_len: int, dtype: torch.dtype | None = None
) -> list[FixedKVCache]:
    """One FixedKVCache per layer, all sharing one `index` tensor."""
    c, ref = model.config, model.reference_tensor()
    index = torch.zeros(1, dtype=torch.long, device=ref.device)
    return [
        FixedKVCache(
            batch_size,
            c.kv_heads,
            max_len,
            c.head_dim,
            device=ref.device,
            dtype=dtype or ref.dtype,
            index=index,
        )
        for _ in range(c.n_layers)
    ]


def fixed_step(
    model: GPT, caches: list[FixedKVCache], tok: Tensor, index: Tensor, shift: Tensor
) -> Tensor:
    """One token per row through fixed-shape caches: tok (B, 1) -> logits (B, V)."""
    slots = torch.arange(caches[0].max_len, device=tok.device)[None, :]  # (1, max_len)
    masked = (slots > index) | (slots < shift)  # (B, max_len), True = not attended
    positions = index[None, :] - shift  # (B, 1)
    x = model.embed.embed_checked(tok, positions)
    rope = model.rope_tables(positions)
    for block, cache in zip(model.blocks, caches, strict=True):
        # need_weights=True takes the written-out softmax path, which inductor fuses into its
        # own kernels (SDPA would stay an opaque call); the unused weights are optimised away
        x, _ = block(x, masked, True, cache, rope)
    return model.logits(x)[:, -1]


# Inductor's pass that writes a one-row matmul (M = 1, other sides <= 2048) as multiply + sum,
# fused with its neighbours: for small models a BLAS call per layer costs more than the maths.
INDUCTOR_OPTIONS = {"post_grad_fusion_options": {"decompose_mm_pass": {}}}

_compiled: StepFn | None = None


def compiled_step() -> StepFn:
    """`torch.compile(fixed_step)`, built once and shared; it compiles once per model shape
    (and batch size, cache length and dtype) on first use, and recompiles for none of the steps
    of a generation."""
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(fixed_step, dynamic=False, options=INDUCTOR_OPTIONS)
    return _compiled

"""Which models the native decode step covers: `unsupported(model)` says why not (None: it does).

    unsupported(model) -> str | None     why the native step does not cover this model
    usable(model) -> bool                whether it may run now (eval mode, no gradients)

What it covers (`native_step` returns None for anything else, leaving PyTorch to run the step):
  * a pre-LN lamina GPT, float32 on the CPU (LayerNorm or RMSNorm, with or
    without gains and shifts; GELU, ReLU, ReLU² or SwiGLU; learned, sinusoidal, rotary or no
    positions; grouped-query attention, QK-norm, biases, embedding scale, logit soft cap);
  * linears that are plain `nn.Linear` (float32), `Int4Linear` or `Int8Linear` (grouped or per
    row) with input widths a multiple of 32 for the quantized ones, or `BlockLinear`s of GGML
    blocks as a GGUF file holds them (Q4_K, Q5_K, Q6_K, Q8_0, Q5_0, Q5_1, parts of different
    kinds stacked by rows); a LoRA-wrapped layer is not covered (merge it first);
  * a token table that is float32, an `Int8Embedding` or a `BlockEmbedding` (a tied head
    reading the same blocks);
  * float32 or float16 `KVCache`s of one length (checked when a NativeStep is built; float16:
    the server's 16-bit rows, decode.c's kv16).
It computes what the model computes in eval mode without gradients: dropout is not applied,
so callers use it only then (`usable(model)`).

Deliberately unaware of the C structs (structs.py) and of running the step (step.py).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lamina.block import LayerNorm, RMSNorm
from lamina.models.gpt import GPT
from lamina.native.pointers import kind_of
from lamina.native.structs import ACTIVATIONS, GGML_KINDS


def _float32(t: Tensor | None) -> bool:
    return t is None or (t.dtype == torch.float32 and t.device.type == "cpu")


def _linear_problem(name: str, m: nn.Module) -> str | None:
    kind = kind_of(m)
    if kind == "float" and type(m) is nn.Linear:
        return None if _float32(m.weight) and _float32(m.bias) else f"{name} is not float32"
    if kind == "int4":
        return None if _blocks_of_32(m.group_size) else f"{name}: int4 groups of {m.group_size}"
    if kind == "int8":
        g = m.group_size
        if m.in_features % 32 or (g is not None and not _blocks_of_32(g)):
            return f"{name}: int8 rows of {m.in_features} (groups {m.group_size})"
        return None
    if kind == "ggml":
        bad = [q for q in m.qtypes if q not in GGML_KINDS]
        return f"{name}: GGML blocks {', '.join(bad)}" if bad else None
    return f"{name} is a {type(m).__name__}"


def _blocks_of_32(g: int) -> bool:
    """What decode.c assumes of a group: g / 32 blocks of 32, a power of two."""
    return g > 0 and g % 32 == 0 and (g // 32) & (g // 32 - 1) == 0


def unsupported(model: object) -> str | None:
    """Why the native step does not cover this model (None when it does)."""
    if not isinstance(model, GPT):
        return f"not a lamina GPT ({type(model).__name__})"
    c = model.config
    if not c.norm_first:
        return "post-LN blocks"
    layer_options = {  # Gemma, Phi-3 and Mistral layers: the PyTorch step runs them
        "sliding_window": c.sliding_window is not None,
        "rope_local_theta": c.rope_local_theta is not None,
        "attn_softcap": c.attn_softcap is not None,
        "attn_scale": c.attn_scale is not None,
        "embed_scale": c.embed_scale is not None,
        "norm_offset": c.norm_offset != 0,
        "sandwich_norm": c.sandwich_norm,
        "rotary_dim": c.rotary_dim is not None,
        "longrope": c.rope_scaling is not None and c.rope_scaling.kind == "longrope",
    }
    used = [name for name, on in layer_options.items() if on]
    if used:
        return f"{', '.join(used)}: not in the native step"
    if c.activation not in ACTIVATIONS:
        return f"activation {c.activation!r}"
    if c.head_dim % 2:
        return f"odd head width {c.head_dim}"
    norm_type = LayerNorm if c.norm == "layer" else RMSNorm
    wte = model.embed.wte
    if kind_of(wte) == "float":
        if not _float32(wte.weight):
            return "the token table is not float32"
    elif kind_of(wte) == "ggml-table":
        if wte.qtype not in GGML_KINDS:
            return f"token table of GGML blocks {wte.qtype}"
    elif kind_of(wte) != "int8-table":
        return f"token table {type(wte).__name__}"
    if model.embed.wpe is not None and not _float32(model.embed.wpe.weight):
        return "the position table is not float32"
    linears = [("head", model.head)]
    norms = [model.norm_f]
    for i, b in enumerate(model.blocks):
        linears += [
            (f"block {i} qkv", b.attn.qkv),
            (f"block {i} attention output", b.attn.proj),
            (f"block {i} feed-forward in", b.ff.fc),
            (f"block {i} feed-forward out", b.ff.proj),
        ]
        norms += [b.norm1, b.norm2]
    for name, lin in linears:
        problem = _linear_problem(name, lin)
        if problem:
            return problem
    for n in norms:
        if type(n) is not norm_type or n.eps != c.layer_norm_eps:
            return f"norm {type(n).__name__}"
        if not (_float32(n.weight) and _float32(getattr(n, "bias", None))):
            return "a norm is not float32"
    return None


def usable(model: nn.Module) -> bool:
    """Whether a step may run natively now: eval mode, no gradients being recorded."""
    return not model.training and not torch.is_grad_enabled()

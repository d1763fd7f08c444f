"""What a model family is: the record type the family table (`families`) is written in.

A `Family` declares, once, everything the converters need to read and write one architecture:

  * its names: Hugging Face `model_type`s (the first is written) and model class, and the GGUF
    `general.architecture` (None: no GGUF form);
  * `fixed`: the GPTConfig fields every model of the family has (positions, norms, activation,
    QK-norm, pre/post norms, the `1 + weight` norm offset, ...);
  * `keys`: the config fields carried as numbers, each with its config.json name(s) and its GGUF
    `{arch}.` key; `hf_defaults` are the config class's defaults for names a config.json leaves
    out (as transformers fills them), `hf_required` values the family needs (refused otherwise,
    written on export);
  * its options, each read the same way for every family by `family_config`: how the feed-forward
    activation is named, where the biases come from, how sliding windows are declared, which
    rope scalings it runs, partial rotary, Gemma's query_pre_attn_scalar and embedding scale,
    and the rules llama.cpp hard-codes for its GGUF files (window pattern, local rope base);
  * `block` and `top`: each lamina tensor (inside `blocks.{i}.` or at the top) -> (HF name, GGUF
    name) in tensor_map's spec language: "a|b|c" parts stacked along dim 0 (lamina fuses them),
    ":T" transposed (HF GPT-2's Conv1D), ":Rq"/":Rk" llama.cpp's rotary row permutation of q/k,
    ":+1" a norm gain stored with one added (llama.cpp's Gemma files); None: no counterpart.

A family is one record in `families.FAMILIES` plus its tests. Deliberately unaware of files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Spec = tuple[str | None, str | None]  # (HF spec, GGUF spec)
Window = Literal["none", "all", "gated", "layers"]


@dataclass(frozen=True)
class Key:
    """One GPTConfig field as a number in both formats: config.json name(s) (the first read,
    all written) and the GGUF key after `{arch}.` (`gguf_default` when a file lacks it; None:
    required, or the GPTConfig default when `optional`)."""

    field: str
    hf: tuple[str, ...] = ()
    gguf: str | None = None
    gguf_default: Any = None
    optional: bool = False  # absent or None in both formats: the GPTConfig default


@dataclass(frozen=True)
class Family:
    """One model family, declared once (see the module docstring)."""

    name: str
    title: str  # for messages: "Llama", "Gemma 2"
    hf_types: tuple[str, ...]
    hf_class: str
    gguf_arch: str | None
    fixed: Mapping[str, Any]
    keys: tuple[Key, ...]
    hf_defaults: Mapping[str, Any]
    block: Mapping[str, Spec]
    top: Mapping[str, Spec]
    hf_block: str = "model.layers.{i}."
    hf_prefix: str = ""  # optional on read (GPT-2's "transformer."), written on export
    hf_ignored: str = r"(.*\.)?rotary_emb\.inv_freq$"  # stored tensors that are not weights
    hf_required: Mapping[str, Any] = field(default_factory=dict)
    # activation: the config.json name, and its values -> lamina's (the first one written)
    act_key: str = "hidden_act"
    activations: Mapping[str, str] = field(default_factory=lambda: {"silu": "swiglu"})
    # (qkv, o_proj, mlp) biases: a config.json name holding a bool, or a fixed bool
    biases: tuple[str | bool, str | bool, str | bool] = (False, False, False)
    window: Window = "none"  # all: one window for every layer; gated: use_sliding_window;
    #                          layers: layer_types ("sliding_attention" / "full_attention")
    window_period: int | None = None  # without layer_types: every n-th layer full (Gemma)
    rope_kinds: tuple[str, ...] = ()  # RopeScaling kinds read and written
    partial_rotary: bool = False  # partial_rotary_factor -> rotary_dim (Phi-3/Phi-4-mini)
    local_rope: bool = False  # sliding layers' own base: rope_local_base_freq (Gemma 3)
    attn_scalar: bool = False  # query_pre_attn_scalar -> attn_scale (Gemma)
    embed_sqrt_d: bool = False  # embeddings times sqrt(d_model) (Gemma)
    gguf_local_theta: float | None = None  # llama.cpp's fixed sliding-layer base (Gemma 3)
    gguf_big_scale_layers: int | None = None  # llama.cpp scales q by (d / heads)^-1/2 at this
    #                                           depth (the 27B Gemmas), else head_dim^-1/2

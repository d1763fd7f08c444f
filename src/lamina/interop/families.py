"""The family table: one `Family` record (see `family`) per architecture lamina opens and writes.

    FAMILIES                     name -> Family, in export order (the first that expresses a
                                 model is the one written)
    by_hf_type(model_type)       the family of a config.json (None: not one lamina reads)
    by_gguf_arch(arch)           the family of a GGUF file (None: not one lamina reads)
    HF_TYPES, GGUF_ARCHS         every model_type and architecture lamina reads

Families: GPT-2; Llama 1-3.x (and SmolLM; rope scaling linear or llama3, in GGUF as
`rope_freqs.weight`); Mistral (one sliding window; llama.cpp files it as arch llama); Qwen2/2.5
(q/k/v biases); Qwen3 (QK-norm, head_dim); Gemma 2 (embedding scale, `1 + weight` norms before
and after attention and the MLP, GeGLU, attention and logit soft caps, sliding layers
alternating with global ones); Gemma 3 (Gemma 2 with QK-norm, no caps, a local rope base for
the sliding layers, five sliding layers per global one); Phi-3 / Phi-4-mini (fused qkv_proj and
gate_up_proj, partial rotary, longrope). Adding a family is adding a record here (and its tests).
"""

from __future__ import annotations

from lamina.interop.family import Family, Key, Spec

# config fields every rotary family names alike (HF config.json name, GGUF key)
_ROTARY_KEYS = (
    Key("vocab_size", ("vocab_size",), "vocab_size"),
    Key("block_size", ("max_position_embeddings",), "context_length"),
    Key("d_model", ("hidden_size",), "embedding_length"),
    Key("n_layers", ("num_hidden_layers",), "block_count"),
    Key("n_heads", ("num_attention_heads",), "attention.head_count"),
    Key("n_kv_heads", ("num_key_value_heads",), "attention.head_count_kv", optional=True),
    Key("d_ff", ("intermediate_size",), "feed_forward_length"),
    Key("layer_norm_eps", ("rms_norm_eps",), "attention.layer_norm_rms_epsilon", 1e-5),
    Key("init_std", ("initializer_range",)),
    Key("dropout", ("attention_dropout",)),
    Key("tie_weights", ("tie_word_embeddings",)),
)
_CAPS = (
    Key("logit_softcap", ("final_logit_softcapping",), "final_logit_softcapping", optional=True),
    Key("attn_softcap", ("attn_logit_softcapping",), "attn_logit_softcapping", optional=True),
)
_ROTARY = dict(positions="rope", norm="rms", norm_first=True, norm_gain=True)
# the Llama layout: lamina name inside blocks.{i} -> (HF inside model.layers.{i}, GGUF in blk.{i})
# fmt: off
_QKV = "self_attn.q_proj.{0}|self_attn.k_proj.{0}|self_attn.v_proj.{0}"
_LLAMA_BLOCK: dict[str, Spec] = {
    "norm1.weight": ("input_layernorm.weight", "attn_norm.weight"),
    "attn.qkv.weight": (_QKV.format("weight"), "attn_q.weight:Rq|attn_k.weight:Rk|attn_v.weight"),
    "attn.qkv.bias": (_QKV.format("bias"), "attn_q.bias:Rq|attn_k.bias:Rk|attn_v.bias"),
    "attn.proj.weight": ("self_attn.o_proj.weight", "attn_output.weight"),
    "attn.proj.bias": ("self_attn.o_proj.bias", "attn_output.bias"),
    "norm2.weight": ("post_attention_layernorm.weight", "ffn_norm.weight"),
    "ff.fc.weight": ("mlp.gate_proj.weight|mlp.up_proj.weight", "ffn_gate.weight|ffn_up.weight"),
    "ff.fc.bias": ("mlp.gate_proj.bias|mlp.up_proj.bias", "ffn_gate.bias|ffn_up.bias"),
    "ff.proj.weight": ("mlp.down_proj.weight", "ffn_down.weight"),
    "ff.proj.bias": ("mlp.down_proj.bias", "ffn_down.bias"),
}
_TOP: dict[str, Spec] = {
    "embed.wte.weight": ("model.embed_tokens.weight", "token_embd.weight"),
    "norm_f.weight": ("model.norm.weight", "output_norm.weight"),
    "head.weight": ("lm_head.weight", "output.weight"),
}
_QK_NORM: dict[str, Spec] = {
    "attn.q_gain": ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    "attn.k_gain": ("self_attn.k_norm.weight", "attn_k_norm.weight"),
}
_GPT2_BLOCK: dict[str, Spec] = {
    "norm1.weight": ("ln_1.weight", "attn_norm.weight"),
    "norm1.bias": ("ln_1.bias", "attn_norm.bias"),
    "attn.qkv.weight": ("attn.c_attn.weight:T", "attn_qkv.weight"),
    "attn.qkv.bias": ("attn.c_attn.bias", "attn_qkv.bias"),
    "attn.proj.weight": ("attn.c_proj.weight:T", "attn_output.weight"),
    "attn.proj.bias": ("attn.c_proj.bias", "attn_output.bias"),
    "norm2.weight": ("ln_2.weight", "ffn_norm.weight"),
    "norm2.bias": ("ln_2.bias", "ffn_norm.bias"),
    "ff.fc.weight": ("mlp.c_fc.weight:T", "ffn_up.weight"),
    "ff.fc.bias": ("mlp.c_fc.bias", "ffn_up.bias"),
    "ff.proj.weight": ("mlp.c_proj.weight:T", "ffn_down.weight"),
    "ff.proj.bias": ("mlp.c_proj.bias", "ffn_down.bias"),
}
_GPT2_TOP: dict[str, Spec] = {
    "embed.wte.weight": ("transformer.wte.weight", "token_embd.weight"),
    "embed.wpe.weight": ("transformer.wpe.weight", "position_embd.weight"),
    "norm_f.weight": ("transformer.ln_f.weight", "output_norm.weight"),
    "norm_f.bias": ("transformer.ln_f.bias", "output_norm.bias"),
    "head.weight": ("lm_head.weight", "output.weight"),
}
# fmt: on
_UNPERMUTED = {  # qwen2/qwen3/gemma/phi: llama.cpp keeps HF's row order (NeoX-style rope)
    k: (hf, gg.replace(":Rq", "").replace(":Rk", "") if gg else gg)
    for k, (hf, gg) in _LLAMA_BLOCK.items()
}
_GEMMA_BLOCK: dict[str, Spec] = {  # llama.cpp stores Gemma's norm gains with the 1 added
    **{k: v for k, v in _UNPERMUTED.items() if ".bias" not in k and "norm" not in k},
    "norm1.weight": ("input_layernorm.weight", "attn_norm.weight:+1"),
    "post_attn_norm.weight": ("post_attention_layernorm.weight", "post_attention_norm.weight:+1"),
    "norm2.weight": ("pre_feedforward_layernorm.weight", "ffn_norm.weight:+1"),
    "post_ff_norm.weight": ("post_feedforward_layernorm.weight", "post_ffw_norm.weight:+1"),
}
_GEMMA_TOP = {**_TOP, "norm_f.weight": ("model.norm.weight", "output_norm.weight:+1")}
_GEMMA = dict(
    _ROTARY, activation="geglu", norm_offset=1.0, sandwich_norm=True, qkv_bias=False, bias=False
)
_GEMMA_DEFAULTS = dict(
    vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
    num_attention_heads=8, num_key_value_heads=4, head_dim=256,
    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192, initializer_range=0.02,
    rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=10000.0, attention_bias=False,
    attention_dropout=0.0, query_pre_attn_scalar=256, sliding_window=4096,
)  # fmt: skip
_LLAMA_DEFAULTS = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
    max_position_embeddings=2048, initializer_range=0.02, rms_norm_eps=1e-6,
    tie_word_embeddings=False, rope_theta=10000.0, attention_bias=False, attention_dropout=0.0,
    mlp_bias=False, head_dim=None,
)  # fmt: skip
_QWEN_DEFAULTS = dict(
    _LLAMA_DEFAULTS, vocab_size=151936, intermediate_size=22016, max_position_embeddings=32768,
    use_sliding_window=False, sliding_window=None,
)  # fmt: skip

_RECORDS = (
    Family(
        "gpt2",
        "GPT-2",
        ("gpt2",),
        "GPT2LMHeadModel",
        "gpt2",
        fixed=dict(positions="learned", norm="layer", norm_first=True, norm_gain=True),
        keys=(
            Key("vocab_size", ("vocab_size",), "vocab_size"),
            Key("block_size", ("n_positions",), "context_length"),
            Key("d_model", ("n_embd",), "embedding_length"),
            Key("n_layers", ("n_layer",), "block_count"),
            Key("n_heads", ("n_head",), "attention.head_count"),
            Key("d_ff", ("n_inner",), "feed_forward_length", optional=True),
            Key("layer_norm_eps", ("layer_norm_epsilon",), "attention.layer_norm_epsilon", 1e-5),
            Key("init_std", ("initializer_range",)),
            Key("dropout", ("resid_pdrop", "embd_pdrop", "attn_pdrop")),
            Key("tie_weights", ("tie_word_embeddings",)),
        ),
        hf_defaults=dict(
            vocab_size=50257,
            n_positions=1024,
            n_embd=768,
            n_layer=12,
            n_head=12,
            n_inner=None,
            activation_function="gelu_new",
            resid_pdrop=0.1,
            layer_norm_epsilon=1e-5,
            initializer_range=0.02,
            scale_attn_weights=True,
            scale_attn_by_inverse_layer_idx=False,
            add_cross_attention=False,
            tie_word_embeddings=True,
        ),  # fmt: skip
        block=_GPT2_BLOCK,
        top=_GPT2_TOP,
        hf_block="transformer.h.{i}.",
        hf_prefix="transformer.",
        hf_ignored=r"transformer\.h\.\d+\.attn\.(bias|masked_bias)$",
        hf_required=dict(
            scale_attn_weights=True,
            scale_attn_by_inverse_layer_idx=False,
            add_cross_attention=False,
        ),  # fmt: skip
        act_key="activation_function",
        activations={"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu"},
        biases=(True, True, True),
    ),  # fmt: skip
    Family(
        "llama",
        "Llama",
        ("llama",),
        "LlamaForCausalLM",
        "llama",
        fixed=_ROTARY,
        keys=_ROTARY_KEYS,
        hf_defaults=_LLAMA_DEFAULTS,
        block=_LLAMA_BLOCK,
        top=_TOP,
        biases=("attention_bias", "attention_bias", "mlp_bias"),
        rope_kinds=("linear", "llama3"),
    ),  # fmt: skip
    Family(
        "mistral",
        "Mistral",
        ("mistral",),
        "MistralForCausalLM",
        "llama",
        fixed=_ROTARY,
        keys=_ROTARY_KEYS,
        block=_LLAMA_BLOCK,
        top=_TOP,
        hf_defaults=dict(
            _LLAMA_DEFAULTS,
            intermediate_size=14336,
            num_key_value_heads=8,
            max_position_embeddings=4096 * 32,
            sliding_window=4096,
        ),
        window="all",
    ),  # fmt: skip
    Family(
        "qwen2",
        "Qwen2",
        ("qwen2",),
        "Qwen2ForCausalLM",
        "qwen2",
        fixed=_ROTARY,
        keys=_ROTARY_KEYS,
        hf_defaults=_QWEN_DEFAULTS,
        block=_UNPERMUTED,
        top=_TOP,
        biases=(True, False, False),
        window="gated",
        rope_kinds=("linear",),
    ),  # fmt: skip
    Family(
        "qwen3",
        "Qwen3",
        ("qwen3",),
        "Qwen3ForCausalLM",
        "qwen3",
        fixed=dict(_ROTARY, qk_norm=True),
        keys=_ROTARY_KEYS,
        hf_defaults=dict(_QWEN_DEFAULTS, head_dim=128),
        block={**_UNPERMUTED, **_QK_NORM},
        top=_TOP,
        biases=("attention_bias", "attention_bias", False),
        window="gated",
        rope_kinds=("linear",),
    ),  # fmt: skip
    Family(
        "gemma2",
        "Gemma 2",
        ("gemma2",),
        "Gemma2ForCausalLM",
        "gemma2",
        fixed=_GEMMA,
        keys=_ROTARY_KEYS + _CAPS,
        hf_defaults=dict(
            _GEMMA_DEFAULTS, final_logit_softcapping=30.0, attn_logit_softcapping=50.0
        ),
        block=_GEMMA_BLOCK,
        top=_GEMMA_TOP,
        act_key="hidden_activation",
        activations={"gelu_pytorch_tanh": "geglu"},
        window="layers",
        window_period=2,
        attn_scalar=True,
        embed_sqrt_d=True,
        gguf_big_scale_layers=46,
    ),  # fmt: skip
    Family(
        "gemma3",
        "Gemma 3",
        ("gemma3_text",),
        "Gemma3ForCausalLM",
        "gemma3",
        fixed=dict(_GEMMA, qk_norm=True),
        keys=_ROTARY_KEYS + _CAPS,
        hf_defaults=dict(
            _GEMMA_DEFAULTS,
            vocab_size=262208,
            max_position_embeddings=131072,
            rope_theta=1e6,
            rope_local_base_freq=10000.0,
            sliding_window_pattern=6,
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
        ),
        block={**_GEMMA_BLOCK, **{k: (hf, gg + ":+1") for k, (hf, gg) in _QK_NORM.items()}},
        top=_GEMMA_TOP,
        act_key="hidden_activation",
        activations={"gelu_pytorch_tanh": "geglu"},
        window="layers",
        window_period=6,
        rope_kinds=("linear",),
        local_rope=True,
        attn_scalar=True,
        embed_sqrt_d=True,
        gguf_local_theta=10000.0,
        gguf_big_scale_layers=62,
    ),  # fmt: skip
    Family(
        "phi3",
        "Phi-3",
        ("phi3",),
        "Phi3ForCausalLM",
        "phi3",
        fixed=dict(_ROTARY, activation="swiglu", qkv_bias=False, bias=False),
        keys=_ROTARY_KEYS,
        hf_defaults=dict(
            _LLAMA_DEFAULTS,
            vocab_size=32064,
            hidden_size=3072,
            intermediate_size=8192,
            max_position_embeddings=4096,
            original_max_position_embeddings=4096,
            rms_norm_eps=1e-5,
            sliding_window=None,
        ),
        block={
            "norm1.weight": ("input_layernorm.weight", "attn_norm.weight"),
            "attn.qkv.weight": ("self_attn.qkv_proj.weight", "attn_qkv.weight"),
            "attn.proj.weight": ("self_attn.o_proj.weight", "attn_output.weight"),
            "norm2.weight": ("post_attention_layernorm.weight", "ffn_norm.weight"),
            "ff.fc.weight": ("mlp.gate_up_proj.weight", "ffn_up.weight"),
            "ff.proj.weight": ("mlp.down_proj.weight", "ffn_down.weight"),
        },
        top=_TOP,
        window="all",
        rope_kinds=("longrope",),
        partial_rotary=True,
    ),  # fmt: skip
)
FAMILIES: dict[str, Family] = {f.name: f for f in _RECORDS}
HF_TYPES: tuple[str, ...] = tuple(t for f in _RECORDS for t in f.hf_types)
GGUF_ARCHS: tuple[str, ...] = tuple(dict.fromkeys(f.gguf_arch for f in _RECORDS if f.gguf_arch))


def by_hf_type(model_type: object) -> Family | None:
    """The family whose config.json carries this model_type."""
    return next((f for f in _RECORDS if model_type in f.hf_types), None)


def by_gguf_arch(arch: object) -> Family | None:
    """The family a GGUF file of this architecture is read as (llama: Llama, windows or not)."""
    return next((f for f in _RECORDS if f.gguf_arch == arch), None)

"""Hugging Face Llama-family checkpoints in and out: Llama 1-3.x, SmolLM, Mistral, Qwen2/2.5, Qwen3.

    load_hf_llama(dir, dtype=None) -> GPT  dir: config.json (model_type llama, mistral, qwen2 or
                                           qwen3) + safetensors, single or sharded; built on the
                                           meta device, tensors read into place (`hf_weights`)
    save_hf_llama(model, dir, tokenizer)   config.json + model.safetensors that
                                           transformers.LlamaForCausalLM.from_pretrained loads
    config_from_hf_llama(dict) -> GPTConfig      hf_llama_config(GPTConfig) -> dict

All four are a lamina GPT with positions="rope", norm="rms", activation="swiglu" and pre-norm
blocks; `FAMILIES` says where they differ:
  * llama/mistral: attention_bias covers q, k, v and o (Mistral has none), mlp_bias the MLP;
  * qwen2: q, k and v have biases, o and the MLP none (lamina's qkv_bias=True, bias=False);
  * qwen3: QK-norm (an RMSNorm over each head's hd dims with one gain shared by the heads,
    before RoPE: lamina's qk_norm) and a head_dim that need not be hidden_size / heads (d_head).
Names inside `model.layers.{i}`: input_layernorm = norm1, post_attention_layernorm = norm2,
o_proj = attn.proj, down_proj = ff.proj, q_norm/k_norm = attn.q_gain/k_gain. lamina fuses what
HF keeps apart: `attn.qkv` is [q_proj | k_proj | v_proj] stacked along the output dim (widths
H hd, H_kv hd, H_kv hd), and `ff.fc` is [gate_proj | up_proj]. No transposes: both sides are
nn.Linear. Rotary layouts agree (half-split, HF's `rotate_half`), so no rows are permuted. A tied
head is the token table; an untied one is `lm_head.weight`. `rotary_emb.inv_freq` buffers in
older checkpoints are ignored. rope_scaling (rope_parameters in transformers 5) of type
"linear" or "llama3" is lamina's `RopeScaling`.

lamina's `bias` covers o_proj and the MLP together, so a folder with a bias on one but not the
other is refused. Refused too, in one line naming the setting: other rope types (dynamic, yarn,
longrope, ...), a partial rotary factor, a sliding window shorter than the context, an
activation other than silu; on export, lamina models Llama cannot express.
Deliberately unaware of training and of the transformers package (never imported).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lamina.attention import RopeScaling
from lamina.checkpoint import strip_compiled_prefix, unwrap
from lamina.errors import LaminaError
from lamina.interop.hf_gpt2 import write_hf_folder
from lamina.interop.hf_weights import Plan, load_hf_folder
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.tokenizers.kinds import Tokenizer

# the configs' defaults, for fields a config.json leaves out (LlamaConfig's, then each family's)
_HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
    max_position_embeddings=2048, initializer_range=0.02, rms_norm_eps=1e-6,
    tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None, attention_bias=False,
    attention_dropout=0.0, mlp_bias=False, head_dim=None,
)  # fmt: skip
# model_type -> (its config class's defaults where they differ from Llama's, its layout: q/k/v
# bias, o_proj bias and MLP bias as config keys or fixed values, QK-norm)
FAMILIES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "llama": ({}, dict(qkv_bias="attention_bias", o_bias="attention_bias", mlp_bias="mlp_bias")),
    "mistral": (dict(sliding_window=4096, max_position_embeddings=4096 * 32),
                dict(qkv_bias=False, o_bias=False, mlp_bias=False)),
    "qwen2": (dict(use_sliding_window=False, max_position_embeddings=32768),
              dict(qkv_bias=True, o_bias=False, mlp_bias=False)),
    "qwen3": (dict(use_sliding_window=False, head_dim=128, max_position_embeddings=32768),
              dict(qkv_bias="attention_bias", o_bias="attention_bias", mlp_bias=False,
                   qk_norm=True)),
}  # fmt: skip


def tensor_groups(config: GPTConfig) -> list[tuple[str, list[str]]]:
    """(lamina name, HF names concatenated along dim 0 to make it) for every stored tensor."""
    groups = [("embed.wte.weight", ["model.embed_tokens.weight"])]
    for i in range(config.n_layers):
        hf = f"model.layers.{i}."
        kinds = ["weight"] + (["bias"] if config.qkv_bias else [])
        groups += [
            (f"blocks.{i}.norm1.weight", [hf + "input_layernorm.weight"]),
            *[
                (f"blocks.{i}.attn.qkv.{k}", [f"{hf}self_attn.{p}_proj.{k}" for p in "qkv"])
                for k in kinds
            ],
            (f"blocks.{i}.norm2.weight", [hf + "post_attention_layernorm.weight"]),
        ]
        if config.qk_norm and config.norm_gain:
            groups += [
                (f"blocks.{i}.attn.q_gain", [hf + "self_attn.q_norm.weight"]),
                (f"blocks.{i}.attn.k_gain", [hf + "self_attn.k_norm.weight"]),
            ]
        for k in ["weight"] + (["bias"] if config.bias else []):
            groups += [
                (f"blocks.{i}.attn.proj.{k}", [f"{hf}self_attn.o_proj.{k}"]),
                (f"blocks.{i}.ff.fc.{k}", [f"{hf}mlp.gate_proj.{k}", f"{hf}mlp.up_proj.{k}"]),
                (f"blocks.{i}.ff.proj.{k}", [f"{hf}mlp.down_proj.{k}"]),
            ]
    groups.append(("norm_f.weight", ["model.norm.weight"]))
    if not config.tie_weights:
        groups.append(("head.weight", ["lm_head.weight"]))
    return groups


def _split_sizes(config: GPTConfig, name: str) -> list[int]:
    """Rows of each HF tensor inside a fused lamina tensor."""
    if ".attn.qkv." in name:
        hd = config.head_dim
        return [config.n_heads * hd, config.kv_heads * hd, config.kv_heads * hd]
    if ".ff.fc." in name:
        return [config.ff_width, config.ff_width]
    return []


def llama_plan(config: GPTConfig) -> Plan:
    """The tensor plan of a Llama-family folder (see `hf_weights.gather`)."""
    return [
        (ours, names, False, _split_sizes(config, ours) if len(names) > 1 else None)
        for ours, names in tensor_groups(config)
    ]


def llama_ignored(config: GPTConfig) -> Callable[[str], bool]:
    """Stored tensors that are not weights: old rotary buffers, and a tied head."""
    return lambda key: (
        key.endswith("rotary_emb.inv_freq") or (key == "lm_head.weight" and config.tie_weights)
    )


def _rope(c: dict[str, Any], where: str) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling), refusing every rope setting lamina does not implement."""
    params = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise LaminaError(f"{where}: rope_scaling must be an object or null, got {params!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    factor = params.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise LaminaError(f"{where}: lamina's GPT cannot express partial_rotary_factor={factor}")
    theta = float(params.get("rope_theta", c["rope_theta"]))
    if kind == "default":
        return theta, None
    try:
        if kind == "linear":
            return theta, RopeScaling("linear", float(params["factor"]))
        if kind == "llama3":
            return theta, RopeScaling(
                "llama3",
                float(params["factor"]),
                float(params["low_freq_factor"]),
                float(params["high_freq_factor"]),
                int(params["original_max_position_embeddings"]),
            )
    except (KeyError, TypeError, ValueError) as e:
        raise LaminaError(f"{where}: rope_scaling of type {kind!r} lacks or mangles {e}") from None
    raise LaminaError(
        f"{where}: lamina's GPT cannot express rope_scaling type {kind!r} "
        "(it runs 'default', 'linear' and 'llama3')"
    )


def _window(c: dict[str, Any], model_type: str) -> int | None:
    """The sliding window the model really uses (None: full attention everywhere)."""
    if model_type in ("qwen2", "qwen3") and not c.get("use_sliding_window"):
        return None  # transformers ignores sliding_window then
    return c.get("sliding_window")


def config_from_hf_llama(hf: Any, where: str = "config.json") -> GPTConfig:
    """A GPTConfig from a Llama, Mistral, Qwen2 or Qwen3 config dict; anything lamina cannot run
    is refused in one line."""
    model_type = hf.get("model_type") if isinstance(hf, dict) else type(hf).__name__
    if model_type not in FAMILIES:
        raise LaminaError(
            f"{where} is not a Llama-family config: model_type is {model_type!r}, expected one "
            f"of {', '.join(FAMILIES)}"
        )
    defaults, layout = FAMILIES[model_type]
    c = {**_HF_DEFAULTS, **defaults, **hf}
    theta, scaling = _rope(c, where)
    heads, width = c["num_attention_heads"], c["hidden_size"]
    natural = (
        width // heads if isinstance(width, int) and isinstance(heads, int) and heads else None
    )
    qkv_bias, o_bias, mlp_bias = (
        c[v] if isinstance(v, str) else v
        for v in map(layout.get, ("qkv_bias", "o_bias", "mlp_bias"))
    )
    window = _window(c, model_type)
    context = c["max_position_embeddings"]
    rules = [
        (c["hidden_act"] == "silu", f"hidden_act={c['hidden_act']!r} (lamina's SwiGLU uses silu)"),
        (
            o_bias == mlp_bias,
            f"a bias on {'o_proj' if o_bias else 'the MLP'} only (lamina's `bias` covers o_proj "
            "and the MLP together)",
        ),
        (
            window is None or (isinstance(context, int) and window >= context),
            f"sliding_window={window} shorter than its context max_position_embeddings="
            f"{context} (lamina's attention sees the whole context)",
        ),
    ]
    for ok, setting in rules:
        if not ok:
            raise LaminaError(f"{where}: lamina's GPT cannot express {setting}")
    head_dim = c["head_dim"]
    try:
        return GPTConfig(
            vocab_size=c["vocab_size"], block_size=context, d_model=width,
            n_heads=heads, n_layers=c["num_hidden_layers"], n_kv_heads=c["num_key_value_heads"],
            d_ff=c["intermediate_size"], dropout=float(c["attention_dropout"]),
            tie_weights=bool(c["tie_word_embeddings"]), qkv_bias=bool(qkv_bias),
            bias=bool(o_bias), activation="swiglu", positions="rope", norm="rms",
            rope_theta=theta, rope_scaling=scaling, init_std=float(c["initializer_range"]),
            layer_norm_eps=float(c["rms_norm_eps"]), qk_norm=layout.get("qk_norm", False),
            d_head=None if head_dim in (None, natural) else head_dim,
        )  # fmt: skip
    except (LaminaError, TypeError, ValueError) as e:
        raise LaminaError(f"{where}: {e}") from e


def _rope_parameters(c: GPTConfig) -> dict[str, Any]:
    s = c.rope_scaling
    if s is None:
        return {"rope_type": "default", "rope_theta": c.rope_theta}
    out = {"rope_type": s.kind, "rope_theta": c.rope_theta, "factor": s.factor}
    if s.kind == "llama3":
        out |= dict(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor,
                    original_max_position_embeddings=s.original_max_positions)  # fmt: skip
    return out


def hf_llama_config(config: GPTConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The config.json of a LlamaForCausalLM equal to a lamina GPT; refuses what Llama lacks."""
    c = config
    rules = [
        (c.positions == "rope", f"positions={c.positions!r}: Llama has rotary positions"),
        (c.norm == "rms", f"norm={c.norm!r}: Llama uses RMSNorm"),
        (c.norm_gain, "norm_gain=False: Llama's RMSNorms have gains"),
        (c.activation == "swiglu", f"activation={c.activation!r}: Llama's MLP is SwiGLU"),
        (c.norm_first, "norm_first=False (post-norm): Llama blocks are pre-norm"),
        (not c.qk_norm, "qk_norm=True: Llama does not normalise q and k"),
        (c.logit_softcap is None, f"logit_softcap={c.logit_softcap}: Llama does not cap logits"),
        (
            c.qkv_bias == c.bias,
            f"qkv_bias={c.qkv_bias} with bias={c.bias}: Llama's attention_bias covers q, k, v "
            "and o together",
        ),
    ]
    for ok, why in rules:
        if not ok:
            raise LaminaError(f"cannot save as Hugging Face Llama: {why}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "intermediate_size": c.ff_width,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.block_size,
        "rms_norm_eps": c.layer_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_parameters": _rope_parameters(c),
        "attention_bias": c.qkv_bias,
        "mlp_bias": c.bias,
        "attention_dropout": c.dropout,
        "initializer_range": c.init_std,
        "tie_word_embeddings": c.tie_weights,
        "bos_token_id": None,
        "eos_token_id": None,
        "dtype": str(dtype).removeprefix("torch."),
    }


def load_hf_llama(path: str | os.PathLike[str], dtype: torch.dtype | None = None) -> GPT:
    """A lamina GPT (eval mode, CPU, fp32 unless `dtype`) from a Llama-family folder."""
    return load_hf_folder(path, config_from_hf_llama, llama_plan, llama_ignored, dtype)


def hf_llama_state(model: nn.Module) -> dict[str, Tensor]:
    """HF LlamaForCausalLM tensors of a lamina GPT (q/k/v and gate/up split apart)."""
    inner = unwrap(model)
    if not isinstance(inner, GPT):
        raise LaminaError(f"save_hf needs a lamina GPT, got {type(inner).__name__}")
    ours = strip_compiled_prefix(inner.state_dict())
    out = {}
    for name, names in tensor_groups(inner.config):
        t = ours[name].detach().to("cpu")
        parts = t.split(_split_sizes(inner.config, name)) if len(names) > 1 else [t]
        for hf, part in zip(names, parts, strict=True):
            out[hf] = part.contiguous()
    return out


def save_hf_llama(
    model: nn.Module, path: str | os.PathLike[str], tokenizer: Tokenizer | None = None
) -> Path:
    """Write config.json + model.safetensors for LlamaForCausalLM.from_pretrained(path).

    With a bpe `tokenizer`, its tokenizer.json goes alongside (see lamina.tokenizers.hf_files).
    """
    inner = unwrap(model)
    if not isinstance(inner, GPT):
        raise LaminaError(f"save_hf needs a lamina GPT, got {type(inner).__name__}")
    config = hf_llama_config(inner.config, inner.head.weight.dtype)  # refuses before writing
    return write_hf_folder(path, config, hf_llama_state(inner), tokenizer)

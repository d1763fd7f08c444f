"""Hugging Face Llama checkpoints in and out: names, fused projections and config.

    load_hf_llama(dir) -> GPT              dir: config.json (model_type "llama") + safetensors,
                                           single (model.safetensors) or sharded (an index)
    save_hf_llama(model, dir, tokenizer)   config.json + model.safetensors that
                                           transformers.LlamaForCausalLM.from_pretrained loads
    config_from_hf_llama(dict) -> GPTConfig      hf_llama_config(GPTConfig) -> dict

A Llama is a lamina GPT with positions="rope", norm="rms", activation="swiglu", pre-norm blocks,
no qk-norm and no soft-cap. Names inside `model.layers.{i}`: input_layernorm = norm1,
post_attention_layernorm = norm2, o_proj = attn.proj, down_proj = ff.proj. lamina fuses what HF
keeps apart: `attn.qkv` is [q_proj | k_proj | v_proj] stacked along the output dim (widths
H hd, H_kv hd, H_kv hd), and `ff.fc` is [gate_proj | up_proj]. No transposes: both sides are
nn.Linear. Rotary layouts agree (half-split, HF's `rotate_half`), so no rows are permuted. A tied
head is the token table; an untied one is `lm_head.weight`. `rotary_emb.inv_freq` buffers in
older checkpoints are ignored.

Biases: HF's `attention_bias` covers q, k, v and o together and `mlp_bias` the MLP; lamina's
`qkv_bias` covers q, k, v and `bias` covers o and the MLP, so a folder loads when
attention_bias == mlp_bias. Refused, in one line naming the setting: rope scaling kinds other
than "default" (linear, dynamic, yarn, llama3, ...), a partial rotary factor, sliding windows,
attention bias on some projections only, a head_dim other than hidden_size / heads, an
activation other than silu; on export, lamina models Llama cannot express.
Deliberately unaware of training and of the transformers package (never imported).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lamina.checkpoint import strip_compiled_prefix, unwrap
from lamina.data.tokenizers import Tokenizer
from lamina.errors import LaminaError
from lamina.interop.hf_gpt2 import _listed, load_hf_folder, write_hf_folder
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT

# LlamaConfig's defaults, for fields a config.json leaves out
_HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
    max_position_embeddings=2048, initializer_range=0.02, rms_norm_eps=1e-6,
    tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None, attention_bias=False,
    attention_dropout=0.0, mlp_bias=False, head_dim=None,
)  # fmt: skip


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


def _rope(c: dict[str, Any], where: str) -> float:
    """rope_theta, refusing every rope setting lamina does not implement."""
    params = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise LaminaError(f"{where}: rope_scaling must be an object or null, got {params!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise LaminaError(
            f"{where}: lamina's GPT cannot express rope_scaling type {kind!r} "
            "(only plain rotary positions, rope_type 'default')"
        )
    factor = params.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise LaminaError(f"{where}: lamina's GPT cannot express partial_rotary_factor={factor}")
    return float(params.get("rope_theta", c["rope_theta"]))


def config_from_hf_llama(hf: Any, where: str = "config.json") -> GPTConfig:
    """A GPTConfig from a Hugging Face Llama config dict; anything lamina cannot run is refused."""
    if not isinstance(hf, dict) or hf.get("model_type") != "llama":
        got = hf.get("model_type") if isinstance(hf, dict) else type(hf).__name__
        raise LaminaError(f"{where} is not a Llama config: model_type is {got!r}, expected 'llama'")
    c = {**_HF_DEFAULTS, **hf}
    theta = _rope(c, where)
    heads, width = c["num_attention_heads"], c["hidden_size"]
    natural = (
        width // heads if isinstance(width, int) and isinstance(heads, int) and heads else None
    )
    rules = [
        (c["hidden_act"] == "silu", f"hidden_act={c['hidden_act']!r} (lamina's SwiGLU uses silu)"),
        (
            c["attention_bias"] == c["mlp_bias"],
            f"attention_bias={c['attention_bias']} with mlp_bias={c['mlp_bias']} (bias on some "
            "projections only: lamina's `bias` covers o_proj and the MLP together)",
        ),
        (c.get("sliding_window") is None, f"sliding_window={c.get('sliding_window')}"),
        (not c.get("use_sliding_window", False), "use_sliding_window=true"),
        (
            c["head_dim"] in (None, natural),
            f"head_dim={c['head_dim']} (lamina's heads are hidden_size / "
            f"num_attention_heads = {natural} wide)",
        ),
    ]
    for ok, setting in rules:
        if not ok:
            raise LaminaError(f"{where}: lamina's GPT cannot express {setting}")
    try:
        return GPTConfig(
            vocab_size=c["vocab_size"], block_size=c["max_position_embeddings"], d_model=width,
            n_heads=heads, n_layers=c["num_hidden_layers"], n_kv_heads=c["num_key_value_heads"],
            d_ff=c["intermediate_size"], dropout=float(c["attention_dropout"]),
            tie_weights=bool(c["tie_word_embeddings"]), qkv_bias=bool(c["attention_bias"]),
            bias=bool(c["mlp_bias"]), activation="swiglu", positions="rope", norm="rms",
            rope_theta=theta, init_std=float(c["initializer_range"]),
            layer_norm_eps=float(c["rms_norm_eps"]),
        )  # fmt: skip
    except (LaminaError, TypeError, ValueError) as e:
        raise LaminaError(f"{where}: {e}") from e


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
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "attention_bias": c.qkv_bias,
        "mlp_bias": c.bias,
        "attention_dropout": c.dropout,
        "initializer_range": c.init_std,
        "tie_word_embeddings": c.tie_weights,
        "bos_token_id": None,
        "eos_token_id": None,
        "dtype": str(dtype).removeprefix("torch."),
    }


def lamina_state_llama(hf_state: dict[str, Tensor], model: GPT, where: str) -> dict[str, Tensor]:
    """HF Llama tensors -> lamina names (fusing q/k/v and gate/up), checking keys and shapes."""
    config = model.config
    state = {}
    for key, value in strip_compiled_prefix(hf_state).items():
        if key.endswith("rotary_emb.inv_freq") or (key == "lm_head.weight" and config.tie_weights):
            continue  # a buffer older checkpoints saved; a tied head is the token table
        state[key] = value
    groups = tensor_groups(config)
    wanted = [hf for _, names in groups for hf in names]
    missing = [hf for hf in wanted if hf not in state]
    unexpected = sorted(set(state) - set(wanted))
    if missing or unexpected:
        parts = [f"missing {_listed(missing)}"] if missing else []
        parts += [f"unexpected {_listed(unexpected)}"] if unexpected else []
        raise LaminaError(f"{where} does not match its config.json: {'; '.join(parts)}")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    out = {}
    for ours, names in groups:
        sizes = _split_sizes(config, ours) or [shapes[ours][0]]
        for hf, rows in zip(names, sizes, strict=True):
            want = (rows, *shapes[ours][1:])
            if tuple(state[hf].shape) != want:
                raise LaminaError(
                    f"{where}: tensor {hf} has shape {tuple(state[hf].shape)}, "
                    f"config.json implies {want}"
                )
        out[ours] = torch.cat([state[hf] for hf in names]) if len(names) > 1 else state[names[0]]
    return out


def load_hf_llama(path: str | os.PathLike[str]) -> GPT:
    """A lamina GPT (eval mode, fp32, CPU) from a Hugging Face Llama directory."""
    return load_hf_folder(path, config_from_hf_llama, lamina_state_llama)


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

    With a bpe `tokenizer`, its tokenizer.json goes alongside (see hf_tokenizer).
    """
    inner = unwrap(model)
    if not isinstance(inner, GPT):
        raise LaminaError(f"save_hf needs a lamina GPT, got {type(inner).__name__}")
    config = hf_llama_config(inner.config, inner.head.weight.dtype)  # refuses before writing
    return write_hf_folder(path, config, hf_llama_state(inner), tokenizer)

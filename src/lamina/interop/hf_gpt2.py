"""Hugging Face GPT-2 checkpoints in and out: one small converter of names, transposes and config.

    load_hf_gpt2(dir, dtype=None) -> GPT   dir: config.json + model.safetensors (or a sharded
                                           model.safetensors.index.json, or pytorch_model.bin,
                                           read with torch.load(weights_only=True) only); built
                                           on the meta device, tensors read into place
                                           (`hf_weights`)
    save_hf_gpt2(model, dir)               config.json + model.safetensors that
                                           transformers.GPT2LMHeadModel.from_pretrained loads
    config_from_hf(dict) -> GPTConfig      hf_config(GPTConfig) -> dict

Names: lamina `blocks.{i}.attn.qkv` is HF `h.{i}.attn.c_attn`, and so on (`layer_names`). HF's
Conv1D stores weights as (in, out); nn.Linear as (out, in): c_attn, c_proj and c_fc are
transposed. QKV is [q | k | v] along the output dim in both. Keys may carry a `transformer.`
prefix or not, and torch.compile's `_orig_mod.`; the causal-mask buffers `attn.bias` /
`attn.masked_bias` are ignored. A tied head (`tie_word_embeddings`, GPT-2's default) is the token
table; an untied one is `lm_head.weight`. Weights of any float dtype load into an fp32 model.
HF's three dropout rates become lamina's one (resid_pdrop); export writes it to all three.

Refused, with a LaminaError naming the setting: lamina models GPT-2 cannot express (post-LN,
sinusoidal or rotary positions, no biases, RMSNorm, ReLU²/SwiGLU, grouped-query attention,
QK-norm, a logit soft-cap) and HF configs lamina cannot (other model types, cross-attention,
unscaled or layer-scaled attention, other activations), wrong shapes, missing or unexpected keys.
Deliberately unaware of tokenizers, training and the transformers package (never imported).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lamina.checkpoint import save_tensors, strip_compiled_prefix, unwrap
from lamina.errors import LaminaError
from lamina.files import build_folder, write_json
from lamina.interop.hf_weights import Plan, load_hf_folder
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.tokenizers.hf_files import save_hf_tokenizer
from lamina.tokenizers.kinds import Tokenizer

# lamina name inside block i -> (HF name inside h.{i}, stored transposed by HF's Conv1D)
_BLOCK = {
    "norm1.weight": ("ln_1.weight", False),
    "norm1.bias": ("ln_1.bias", False),
    "attn.qkv.weight": ("attn.c_attn.weight", True),
    "attn.qkv.bias": ("attn.c_attn.bias", False),
    "attn.proj.weight": ("attn.c_proj.weight", True),
    "attn.proj.bias": ("attn.c_proj.bias", False),
    "norm2.weight": ("ln_2.weight", False),
    "norm2.bias": ("ln_2.bias", False),
    "ff.fc.weight": ("mlp.c_fc.weight", True),
    "ff.fc.bias": ("mlp.c_fc.bias", False),
    "ff.proj.weight": ("mlp.c_proj.weight", True),
    "ff.proj.bias": ("mlp.c_proj.bias", False),
}
_TOP = {
    "embed.wte.weight": "wte.weight",
    "embed.wpe.weight": "wpe.weight",
    "norm_f.weight": "ln_f.weight",
    "norm_f.bias": "ln_f.bias",
}
_MASK_BUFFER = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")
_ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu"}
# GPT2Config's defaults, used as transformers uses them: for fields config.json leaves out
_HF_DEFAULTS: dict[str, Any] = dict(
    vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
    activation_function="gelu_new", resid_pdrop=0.1, layer_norm_epsilon=1e-5,
    initializer_range=0.02, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
    add_cross_attention=False, tie_word_embeddings=True,
)  # fmt: skip


def layer_names(config: GPTConfig) -> list[tuple[str, str, bool]]:
    """(lamina name, HF name without `transformer.`, transposed) for every stored tensor."""
    names = [(k, v, False) for k, v in _TOP.items()]
    for i in range(config.n_layers):
        names += [(f"blocks.{i}.{k}", f"h.{i}.{v}", t) for k, (v, t) in _BLOCK.items()]
    if not config.tie_weights:
        names.append(("head.weight", "lm_head.weight", False))
    return names


def config_from_hf(hf: Any, where: str = "config.json") -> GPTConfig:
    """A GPTConfig from a Hugging Face GPT-2 config dict; anything lamina cannot run is refused."""
    if not isinstance(hf, dict) or hf.get("model_type") != "gpt2":
        got = hf.get("model_type") if isinstance(hf, dict) else type(hf).__name__
        raise LaminaError(f"{where} is not a GPT-2 config: model_type is {got!r}, expected 'gpt2'")
    c = {**_HF_DEFAULTS, **hf}
    act = c["activation_function"]
    rules = [
        (act in _ACTIVATIONS, f"activation_function={act!r} (lamina runs {list(_ACTIVATIONS)})"),
        (c["scale_attn_weights"] is True, "scale_attn_weights=false"),
        (c["scale_attn_by_inverse_layer_idx"] is False, "scale_attn_by_inverse_layer_idx=true"),
        (c["add_cross_attention"] is False, "add_cross_attention=true"),
    ]
    for ok, setting in rules:
        if not ok:
            raise LaminaError(f"{where}: lamina's GPT cannot express {setting}")
    try:
        return GPTConfig(
            vocab_size=c["vocab_size"], block_size=c["n_positions"], d_model=c["n_embd"],
            n_heads=c["n_head"], n_layers=c["n_layer"], dropout=float(c["resid_pdrop"]),
            tie_weights=bool(c["tie_word_embeddings"]), d_ff=c["n_inner"],
            activation=_ACTIVATIONS[act], init_std=float(c["initializer_range"]),
            layer_norm_eps=float(c["layer_norm_epsilon"]),
        )  # fmt: skip
    except (LaminaError, TypeError, ValueError) as e:
        raise LaminaError(f"{where}: {e}") from e


def hf_config(config: GPTConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The config.json of a GPT2LMHeadModel equal to a lamina GPT; refuses what GPT-2 lacks."""
    rules = [
        (config.norm_first, "norm_first=False (post-LN): GPT-2 blocks are pre-LN"),
        (config.positions == "learned", f"positions={config.positions!r}: GPT-2 learns them"),
        (config.bias, "bias=False: GPT-2's linear layers and LayerNorms have biases"),
        (config.qkv_bias, "qkv_bias=False: GPT-2's c_attn has a bias"),
        (config.norm == "layer", f"norm={config.norm!r}: GPT-2 uses LayerNorm"),
        (config.norm_gain, "norm_gain=False: GPT-2's LayerNorms have gains"),
        (
            config.activation in ("gelu", "relu"),
            f"activation={config.activation!r}: GPT-2 runs gelu_new or relu",
        ),
        (
            config.kv_heads == config.n_heads,
            f"n_kv_heads={config.n_kv_heads}: GPT-2 has as many key/value heads as query heads",
        ),
        (not config.qk_norm, "qk_norm=True: GPT-2 does not normalise q and k"),
        (
            config.d_head is None,
            f"d_head={config.d_head}: GPT-2's heads are d_model / n_heads wide",
        ),
        (
            config.logit_softcap is None,
            f"logit_softcap={config.logit_softcap}: GPT-2 does not cap its logits",
        ),
    ]
    for ok, why in rules:
        if not ok:
            raise LaminaError(f"cannot save as Hugging Face GPT-2: {why}")
    eot = 50256 if config.vocab_size == 50257 else None
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_embd": config.d_model,
        "n_layer": config.n_layers,
        "n_head": config.n_heads,
        "n_inner": config.d_ff,
        "activation_function": "gelu_new" if config.activation == "gelu" else "relu",
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": config.layer_norm_eps,
        "initializer_range": config.init_std,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "tie_word_embeddings": config.tie_weights,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "dtype": str(dtype).removeprefix("torch."),
    }


def gpt2_plan(config: GPTConfig) -> Plan:
    """The tensor plan of a GPT-2 folder (names without `transformer.`, Conv1D transposed)."""
    return [(ours, [hf], transposed, None) for ours, hf, transposed in layer_names(config)]


def gpt2_ignored(config: GPTConfig) -> Callable[[str], bool]:
    """Stored tensors that are not weights: causal-mask buffers, and a tied head."""
    return lambda key: (
        bool(_MASK_BUFFER.match(key)) or (key == "lm_head.weight" and config.tie_weights)
    )


def load_hf_gpt2(path: str | os.PathLike[str], dtype: torch.dtype | None = None) -> GPT:
    """A lamina GPT (eval mode, CPU, fp32 unless `dtype`) from a Hugging Face GPT-2 folder."""
    return load_hf_folder(
        path,
        config_from_hf,
        gpt2_plan,
        gpt2_ignored,
        dtype,
        lambda k: k.removeprefix("transformer."),
    )


def hf_state(model: nn.Module) -> dict[str, Tensor]:
    """HF GPT2LMHeadModel tensors (`transformer.` names, Conv1D layout) of a lamina GPT."""
    inner = unwrap(model)
    if not isinstance(inner, GPT):
        raise LaminaError(f"save_hf needs a lamina GPT, got {type(inner).__name__}")
    ours = strip_compiled_prefix(inner.state_dict())
    out = {}
    for name, hf, transposed in layer_names(inner.config):
        t = ours[name].detach().to("cpu")
        key = hf if hf.startswith("lm_head") else f"transformer.{hf}"
        out[key] = (t.t() if transposed else t).contiguous()
    return out


def write_hf_folder(
    path: str | os.PathLike[str],
    config: dict[str, Any],
    tensors: dict[str, Tensor],
    tokenizer: Tokenizer | None = None,
) -> Path:
    """config.json + model.safetensors (+ the tokenizer's HF files) at `path`.

    The folder is built beside its final name and swapped in once complete
    (`lamina.files.build_folder`); an existing one is replaced only if lamina wrote it (or it is
    empty). Its inputs (a source folder the caller read) must not overlap it.
    """

    def build(target: Path) -> None:
        save_tensors(target / "model.safetensors", tensors, {"format": "pt"})
        if tokenizer is not None:
            save_hf_tokenizer(tokenizer, target)
        write_json(target / "config.json", config)

    build_folder(path, build, kind="hf", force=True)
    return Path(path)


def save_hf_gpt2(
    model: nn.Module, path: str | os.PathLike[str], tokenizer: Tokenizer | None = None
) -> Path:
    """Write config.json + model.safetensors for GPT2LMHeadModel.from_pretrained(path).

    With a gpt2 or bpe `tokenizer`, its Hugging Face files go alongside (see lamina.tokenizers.hf_files).
    The folder is built beside its final name and swapped in (see `write_hf_folder`).
    """
    inner = unwrap(model)
    if not isinstance(inner, GPT):
        raise LaminaError(f"save_hf needs a lamina GPT, got {type(inner).__name__}")
    config = hf_config(inner.config, inner.head.weight.dtype)  # refuses before writing
    return write_hf_folder(path, config, hf_state(inner), tokenizer)

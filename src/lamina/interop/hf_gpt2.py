"""Hugging Face GPT-2 checkpoints in and out: one small converter of names, transposes and config.

    load_hf_gpt2(dir) -> GPT               dir: config.json + model.safetensors (or a sharded
                                           model.safetensors.index.json, or pytorch_model.bin,
                                           read with torch.load(weights_only=True) only)
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

from lamina.checkpoint import (
    load_state,
    load_tensors,
    save_tensors,
    strip_compiled_prefix,
    torch_load_refusal,
    unwrap,
)
from lamina.data.tokenizers import Tokenizer
from lamina.errors import LaminaError
from lamina.files import build_folder, read_json, write_json
from lamina.interop.hf_tokenizer import save_hf_tokenizer
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT

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
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


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


def _read_bin(path: Path) -> dict[str, Tensor]:
    """torch.load with weights_only=True: tensors and plain containers only, never code."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # any failure to read (bad pickle, truncated zip, ...) is a refusal
        raise LaminaError(torch_load_refusal(path, e)) from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise LaminaError(f"{path} does not hold a flat dict of tensors")
    return state


def read_hf_weights(directory: Path) -> tuple[dict[str, Tensor], Path]:
    """All tensors of a HF checkpoint directory, and the file they came from."""
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if name == "pytorch_model.bin":
            return _read_bin(path), path
        if name == "model.safetensors":
            return load_tensors(path), path
        index = read_json(path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        shards = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
        if not shards or not all(isinstance(s, str) and "/" not in s for s in shards):
            raise LaminaError(f"{path} has no usable weight_map")
        state: dict[str, Tensor] = {}
        for shard in shards:
            state.update(load_tensors(directory / shard))
        return state, path
    raise LaminaError(f"{directory} has no weights: expected one of {', '.join(WEIGHT_FILES)}")


def _listed(keys: list[str], limit: int = 8) -> str:
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def lamina_state(hf_state: dict[str, Tensor], model: GPT, where: str) -> dict[str, Tensor]:
    """HF GPT-2 tensors -> lamina names and layouts, checking keys and shapes against `model`."""
    config = model.config
    state = {}
    for key, value in strip_compiled_prefix(hf_state).items():
        key = key.removeprefix("transformer.")
        if _MASK_BUFFER.match(key) or (key == "lm_head.weight" and config.tie_weights):
            continue  # causal-mask buffers; a tied head is the token table
        state[key] = value
    names = layer_names(config)
    missing = [hf for _, hf, _ in names if hf not in state]
    unexpected = sorted(set(state) - {hf for _, hf, _ in names})
    if missing or unexpected:
        parts = [f"missing {_listed(missing)}"] if missing else []
        parts += [f"unexpected {_listed(unexpected)}"] if unexpected else []
        raise LaminaError(f"{where} does not match its config.json: {'; '.join(parts)}")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    out = {}
    for ours, hf, transposed in names:
        want = shapes[ours][::-1] if transposed else shapes[ours]
        if tuple(state[hf].shape) != want:
            raise LaminaError(
                f"{where}: tensor {hf} has shape {tuple(state[hf].shape)}, "
                f"config.json implies {want}"
            )
        out[ours] = state[hf].t() if transposed else state[hf]
    return out


def load_hf_folder(
    path: str | os.PathLike[str],
    read_config: Callable[[Any, str], GPTConfig],
    to_lamina: Callable[[dict[str, Tensor], GPT, str], dict[str, Tensor]],
) -> GPT:
    """A lamina GPT (eval mode, fp32, CPU) from a Hugging Face folder: `read_config` turns its
    config.json into a GPTConfig, `to_lamina` renames (and checks) its tensors."""
    d = Path(path)
    if not d.is_dir():
        raise LaminaError(f"no such Hugging Face model folder: {d}")
    config = read_config(read_json(d / "config.json"), str(d / "config.json"))
    hf, source = read_hf_weights(d)
    model = GPT(config)
    load_state(model, to_lamina(hf, model, str(source)), str(source))
    return model.eval()


def load_hf_gpt2(path: str | os.PathLike[str]) -> GPT:
    """A lamina GPT (eval mode, fp32, CPU) from a Hugging Face GPT-2 directory."""
    return load_hf_folder(path, config_from_hf, lamina_state)


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

    With a gpt2 or bpe `tokenizer`, its Hugging Face files go alongside (see hf_tokenizer).
    The folder is built beside its final name and swapped in (see `write_hf_folder`).
    """
    inner = unwrap(model)
    if not isinstance(inner, GPT):
        raise LaminaError(f"save_hf needs a lamina GPT, got {type(inner).__name__}")
    config = hf_config(inner.config, inner.head.weight.dtype)  # refuses before writing
    return write_hf_folder(path, config, hf_state(inner), tokenizer)

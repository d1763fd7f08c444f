"""Hugging Face folders of every family in and out: the family record says the names.

    family_of(config_json, where) -> Family     its model_type's record (refused if none)
    config_from_hf(config_json, where) -> GPTConfig
    hf_config(config, dtype) -> dict             the config.json of the family that expresses it
    load_hf(dir, dtype=None) -> GPT              config.json + safetensors (single or sharded)
                                                 or pytorch_model.bin (weights_only); built on
                                                 the meta device, tensors read into place
    hf_state(model) -> (Family, {HF name: Tensor})     save_hf(model, dir, tokenizer=None)
    hf_rows(config) -> (Family, rows)            the tensor rows of the family written

The rows come from the record through `tensor_map` (q/k/v and gate/up split apart where HF keeps
them apart, Conv1D transposed for GPT-2); a family's optional prefix (GPT-2's `transformer.`)
may be present or not on read and is written on export; buffers that are not weights (rotary
`inv_freq`, GPT-2's mask buffers) and a tied head's copy are skipped. Export writes the first
family of the table that expresses the model (family_gguf.expressing): a Llama-layout model as
Llama, with q/k/v biases only as Qwen2, with QK-norm as Qwen3, and so on; what no family can
express is refused before anything is written. Deliberately unaware of the transformers
package (never imported) and of training.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lamina.checkpoint import save_tensors, strip_compiled_prefix, unwrap
from lamina.errors import LaminaError
from lamina.files import build_folder, read_json, write_json
from lamina.interop import tensor_map
from lamina.interop.families import HF_TYPES, by_hf_type
from lamina.interop.family import Family
from lamina.interop.family_config import from_hf, to_hf
from lamina.interop.family_gguf import expressing
from lamina.interop.hf_weights import Plan, load_hf_folder
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.tokenizers.hf_files import save_hf_tokenizer
from lamina.tokenizers.kinds import Tokenizer


def family_of(data: Any, where: str = "config.json") -> Family:
    """The family of a config.json dict, by its model_type."""
    model_type = data.get("model_type") if isinstance(data, dict) else type(data).__name__
    family = by_hf_type(model_type)
    if family is None:
        raise LaminaError(
            f"{where}: model_type {model_type!r} is not one lamina runs ({', '.join(HF_TYPES)})"
        )
    return family


def config_from_hf(data: Any, where: str = "config.json") -> GPTConfig:
    """A GPTConfig from any config.json lamina reads; anything it cannot run is refused."""
    return from_hf(family_of(data, where), data, where)


def hf_config(config: GPTConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """The config.json of the family `config` is written as; refuses what none expresses."""
    return to_hf(expressing(config, "hf"), config, dtype)


def hf_rows(config: GPTConfig) -> tuple[Family, list[tensor_map.Row]]:
    """The family `config` is written as and its HF tensor rows."""
    family = expressing(config, "hf")
    return family, tensor_map.rows(config, tensor_map.lamina_shapes(config), family, "hf")


def _plan(family: Family, config: GPTConfig) -> Plan:
    """hf_weights' plan of the family's rows (HF tensors are transposed at most)."""
    table = tensor_map.rows(config, tensor_map.lamina_shapes(config), family, "hf")
    return [
        (
            r.lamina,
            [p.foreign for p in r.parts],
            r.parts[0].transform is tensor_map.TRANSPOSE,
            [p.rows for p in r.parts] if len(r.parts) > 1 else None,
        )
        for r in table
    ]


def _ignored(family: Family) -> Callable[[GPTConfig], Callable[[str], bool]]:
    pattern = re.compile(family.hf_ignored)
    return lambda config: (
        lambda key: bool(pattern.match(key)) or (key == "lm_head.weight" and config.tie_weights)
    )


def _renamer(family: Family) -> Callable[[str], str] | None:
    p = family.hf_prefix
    if not p:
        return None
    return lambda k: k if k.startswith(p) or k.startswith("lm_head.") else p + k


def load_hf(
    path: str | os.PathLike[str], dtype: torch.dtype | None = None, quantize: str | None = None
) -> GPT:
    """A lamina GPT (eval mode, CPU, fp32 unless `dtype`) from a Hugging Face folder; quantize
    "int8" or "int4": each linear quantized as it is read (lamina.quant.on_read)."""
    d = Path(path)
    if not d.is_dir():
        raise LaminaError(f"no such Hugging Face model folder: {d}")
    family = family_of(read_json(d / "config.json"), str(d / "config.json"))
    return load_hf_folder(
        d,
        lambda data, where: from_hf(family, data, where),
        lambda config: _plan(family, config),
        _ignored(family),
        dtype,
        _renamer(family),
        quantize,
    )


def _gpt(model: nn.Module) -> GPT:
    inner = unwrap(model)
    if not isinstance(inner, GPT):
        raise LaminaError(f"save_hf needs a lamina GPT, got {type(inner).__name__}")
    return inner


def hf_state(model: nn.Module) -> tuple[Family, dict[str, Tensor]]:
    """(family, HF tensors) of a lamina GPT, in the family's names and layout."""
    inner = _gpt(model)
    family, table = hf_rows(inner.config)
    ours = {k: v.detach().to("cpu") for k, v in strip_compiled_prefix(inner.state_dict()).items()}
    return family, tensor_map.to_foreign(table, ours)


def write_hf_folder(
    path: str | os.PathLike[str],
    config: Mapping[str, Any],
    tensors: Mapping[str, Tensor],
    tokenizer: Tokenizer | None = None,
) -> Path:
    """config.json + model.safetensors (+ the tokenizer's HF files) at `path`, built beside its
    final name and swapped in once complete (`lamina.files.build_folder`); an existing folder is
    replaced only if lamina wrote it (or it is empty)."""

    def build(target: Path) -> None:
        save_tensors(target / "model.safetensors", dict(tensors), {"format": "pt"})
        if tokenizer is not None:
            save_hf_tokenizer(tokenizer, target)
        write_json(target / "config.json", dict(config))

    build_folder(path, build, kind="hf", force=True)
    return Path(path)


def save_hf(
    model: nn.Module, path: str | os.PathLike[str], tokenizer: Tokenizer | None = None
) -> Path:
    """Write a folder that transformers' `from_pretrained` loads (the family's model class);
    with a tokenizer, its Hugging Face files go alongside (see hf_tokenizer)."""
    inner = _gpt(model)
    config = hf_config(inner.config, inner.head.weight.dtype)  # refuses before writing
    _, tensors = hf_state(inner)
    return write_hf_folder(path, config, tensors, tokenizer)

"""Model directories: `config.json` + `model.safetensors` (+ `tokenizer.json`), written atomically.

    save_model(dir, model, tokenizer=None)   -> dir/config.json, dir/model.safetensors, ...
    load_model(dir) -> (model, tokenizer or None)        (also exported as `lamina.load`)

A SequenceClassifier's label names (`model.labels`, class id = index) go to `labels.json`
with the classifier's id convention (`lamina.data.labelled.CLASSIFIER_IDS`) and come back as
`model.labels` (None where the file is absent).

Tied weights are stored once (the head is re-tied on load); the `_orig_mod.` prefix that
`torch.compile` adds is stripped on save and on load. Loading never unpickles: safetensors and
JSON only. A missing, unexpected or wrongly shaped tensor is an error naming the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor, nn

import lamina.quant as quant
from lamina.data.labelled import CLASSIFIER_IDS
from lamina.data.tokenizers import Tokenizer, load_tokenizer, save_tokenizer
from lamina.errors import LaminaError
from lamina.files import atomic_write, read_json, write_json
from lamina.models.config import EncoderConfig, GPTConfig
from lamina.models.encoder import Encoder, SequenceClassifier
from lamina.models.gpt import GPT

FORMAT_VERSION = 1
COMPILED_PREFIX = "_orig_mod."


def strip_compiled_prefix(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Remove `torch.compile`'s `_orig_mod.` prefix from every key (wherever it appears)."""
    return {k.replace(COMPILED_PREFIX, ""): v for k, v in state.items()}


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module behind torch.compile / DDP / FSDP wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None or not isinstance(inner, nn.Module):
            return model
        model = inner


def model_tensors(model: nn.Module) -> dict[str, Tensor]:
    """State dict for saving: prefixes stripped, tied head dropped, contiguous CPU tensors."""
    model = unwrap(model)
    if quant.scheme_of(model) is not None:
        return quant.quantized_tensors(model)
    state = strip_compiled_prefix(model.state_dict())
    config = getattr(model, "config", None)
    if isinstance(config, GPTConfig) and config.tie_weights:
        state.pop("head.weight", None)
    return {k: v.detach().to("cpu").contiguous() for k, v in state.items()}


def save_tensors(
    path: str | os.PathLike[str], tensors: dict[str, Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Atomic safetensors write."""
    blob = st_save(tensors, metadata=metadata)
    atomic_write(path, lambda f: f.write(blob))


def load_tensors(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """Read a safetensors file; a truncated or corrupt file is a LaminaError naming it."""
    p = Path(path)
    if not p.is_file():
        raise LaminaError(f"missing file: {p}")
    try:
        return st_load(p.read_bytes())
    except (SafetensorError, ValueError, OSError) as exc:
        raise LaminaError(f"{p} is not a readable safetensors file ({exc})") from exc


def model_to_json(model: nn.Module) -> dict[str, Any]:
    """The config.json of a GPT, an Encoder or a SequenceClassifier."""
    config = getattr(model, "config", None)
    if isinstance(model, SequenceClassifier):
        return {
            "format": FORMAT_VERSION,
            "kind": "classifier",
            "model": config.to_dict(),
            "n_classes": model.classifier.out_features,
            "pooling": model.pooling,
        }
    if isinstance(config, (GPTConfig, EncoderConfig)):
        kind = "gpt" if isinstance(config, GPTConfig) else "encoder"
        data = {"format": FORMAT_VERSION, "kind": kind, "model": config.to_dict()}
        scheme = quant.scheme_of(model)
        return data | ({"quantization": scheme} if scheme is not None else {})
    raise LaminaError("save_model needs a lamina GPT, Encoder or SequenceClassifier")


def model_from_json(data: Any, where: str = "config.json") -> nn.Module:
    """Build the (untrained) model that a config.json describes."""
    if not isinstance(data, dict) or "model" not in data or "kind" not in data:
        raise LaminaError(f"{where} is not a lamina model config (no 'kind' and 'model' fields)")
    if data.get("format", 1) > FORMAT_VERSION:
        raise LaminaError(
            f"{where} has format {data['format']}; this lamina reads up to {FORMAT_VERSION}"
        )
    kind = data["kind"]
    if kind == "gpt" and "quantization" in data:
        return _quantized_gpt(GPTConfig.from_dict(data["model"]), data["quantization"], where)
    if kind == "gpt":
        return GPT(GPTConfig.from_dict(data["model"]))
    if kind == "encoder":
        return Encoder(EncoderConfig.from_dict(data["model"]))
    if kind == "classifier":
        config = EncoderConfig.from_dict(data["model"])
        return SequenceClassifier(config, data.get("n_classes", 2), data.get("pooling", "first"))
    raise LaminaError(f"{where}: unknown model kind {kind!r}")


def _quantized_gpt(config: GPTConfig, scheme: Any, where: str) -> GPT:
    """An empty quantized GPT on the meta device: no float weights are ever allocated."""
    if not isinstance(scheme, dict) or not isinstance(scheme.get("scheme"), str):
        raise LaminaError(f"{where}: 'quantization' must be an object with a 'scheme' field")
    with torch.device("meta"):
        model = GPT(config)
    return quant.quantize_structure(model, scheme["scheme"], scheme.get("group_size", 128))


def load_state(model: nn.Module, state: dict[str, Tensor], where: str = "checkpoint") -> None:
    """Copy `state` into `model` strictly: missing, unexpected or misshapen keys are errors."""
    state = strip_compiled_prefix(state)
    model = unwrap(model)
    expected = model.state_dict()
    config = getattr(model, "config", None)
    scheme = quant.scheme_of(model)
    quantized = scheme is not None
    if isinstance(config, GPTConfig) and config.tie_weights:
        # a tied head is stored once, as the token table (an int4 head is a copy of its own)
        tied = {None: ("head.weight",), "int8": ("head.qweight", "head.scale"), "int4": ()}[
            scheme and scheme["scheme"]
        ]
        expected = {k: v for k, v in expected.items() if k not in tied}
        state = {k: v for k, v in state.items() if k not in tied}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(unexpected)}")
        raise LaminaError(f"{where} does not match the model: {'; '.join(parts)}")
    for k, v in state.items():
        if tuple(v.shape) != tuple(expected[k].shape):
            raise LaminaError(
                f"{where}: tensor {k} has shape {tuple(v.shape)}, the model expects {tuple(expected[k].shape)}"
            )
        if quantized and v.dtype != expected[k].dtype:
            raise LaminaError(
                f"{where}: tensor {k} is {v.dtype}, the quantized model expects {expected[k].dtype}"
            )
    if quantized:  # the model lives on the meta device: take the tensors as they are
        model.load_state_dict(state, strict=False, assign=True)
        quant.finish_loading(model)
        return
    with torch.no_grad():
        for name, tensor in expected.items():
            tensor.copy_(state[name])


def save_model(
    directory: str | os.PathLike[str], model: nn.Module, tokenizer: Tokenizer | None = None
) -> Path:
    """Write config.json, model.safetensors and (if given) tokenizer.json into `directory`."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    inner = unwrap(model)
    config_json = model_to_json(inner)
    save_tensors(d / "model.safetensors", model_tensors(inner), {"format": "pt"})
    if tokenizer is not None:
        save_tokenizer(tokenizer, d / "tokenizer.json")
    if isinstance(inner, SequenceClassifier) and inner.labels is not None:
        write_json(d / "labels.json", {"labels": list(inner.labels), **CLASSIFIER_IDS})
    write_json(d / "config.json", config_json)  # last: its presence marks a complete model
    return d


def load_model(
    directory: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> tuple[nn.Module, Tokenizer | None]:
    """Rebuild the model (and its tokenizer, if saved) from a directory written by `save_model`."""
    d = Path(directory)
    if not d.is_dir():
        raise LaminaError(f"no such model directory: {d}")
    if not (d / "config.json").is_file():
        raise LaminaError(f"{d} is not a lamina model or run directory (no config.json)")
    model = model_from_json(read_json(d / "config.json"), str(d / "config.json"))
    load_state(model, load_tensors(d / "model.safetensors"), str(d / "model.safetensors"))
    tokenizer = load_tokenizer(d / "tokenizer.json") if (d / "tokenizer.json").is_file() else None
    if isinstance(model, SequenceClassifier) and (d / "labels.json").is_file():
        model.labels = _labels(read_json(d / "labels.json"), model, d / "labels.json")
    model.eval()
    return model.to(device), tokenizer


def _labels(data: Any, model: SequenceClassifier, where: Path) -> list[str]:
    """The label names of a labels.json, checked against the classifier's classes."""
    labels = data.get("labels") if isinstance(data, dict) else None
    n = model.classifier.out_features
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise LaminaError(f"{where} has no 'labels' list of strings")
    if len(labels) != n:
        raise LaminaError(f"{where} names {len(labels)} labels; the classifier has {n} classes")
    return labels

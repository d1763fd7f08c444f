"""`--init-from SOURCE`: the model a fine-tune starts from, and what it may not change.

    load_source(path, base) -> Source    any model `lamina.open` reads (a lamina run or model
                                         folder, a Hugging Face folder, a GGUF file), with its
                                         tokenizer if it has one and a record of where the run
                                         started from (kind, path, sha256 of its files)
    source_model(source, config, where) -> GPT   the model a run starts from (SOURCE's tensors
                                         in a model of `config`, or a quantized SOURCE itself)
    source_config(source, overrides) -> GPTConfig   the source's shape; an override that
                                         disagrees is refused naming the field (only dropout,
                                         which changes no tensor, may differ)
    source_tokenizer(source, spec) -> Tokenizer     the source's tokenizer, or, for a source
                                         without one, a fixed-vocabulary spec (byte, gpt2:DIR)
                                         whose size matches the model

The weights are copied into the freshly built model (`session`), so the first step computes
exactly what SOURCE computes. The optimizer and schedule start fresh; their fine-tuning
defaults are in `config.DEFAULTS` (measured: BENCHMARKS.md, "Fine-tuning").

Deliberately unaware of the loop, the optimizer and run directories.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lamina.checkpoint import assign_state
from lamina.data.spec import build_tokenizer
from lamina.errors import LaminaError
from lamina.files import read_json
from lamina.interop.bundle import open_model
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.modes import check_finite
from lamina.quant import scheme_of
from lamina.tokenizers.kinds import Tokenizer
from lamina.training.qlora import wants_quantized

# model fields that change no tensor, so a fine-tune may set them differently from SOURCE
FREE_FIELDS = ("dropout", "attn_dropout")


@dataclass
class Source:
    model: GPT
    tokenizer: Tokenizer | None
    record: dict[str, Any]  # written to train_config.json as "init_from"


def load_source(path: str | os.PathLike[str], base: str = "float") -> Source:
    """The GPT (and tokenizer) of any model `lamina.open` reads; a classifier is refused, and so
    is a quantized model unless `base` (--lora-base) keeps a quantized base: then a GGUF file's
    blocks are kept as stored (no float copy of them is made)."""
    try:
        bundle = open_model(path, quantized=wants_quantized(base))
        bundle.require("decoder", tokenizer=False, verb="train --init-from")
    except LaminaError as e:
        names = (str(path), str(Path(path).expanduser().resolve()))
        said = str(e) if str(e).startswith(names) else f"{path}: {e}"  # the path said once
        raise LaminaError(f"--init-from {said}") from None
    model, origin = bundle.model, bundle.origin
    if scheme_of(model) is not None and base == "float":
        raise LaminaError(f"--init-from {path} is quantized; fine-tune the float model instead")
    record: dict[str, Any] = {
        "source": str(origin.path),
        "format": "lamina" if origin.kind in ("run", "model") else origin.kind,
        "kind": origin.kind,
        "sha256": origin.content_hash,
        "files": [str(f) for f in origin.files],  # what the hash covers (older runs: names too)
    }
    state = origin.path / "trainer_state.json"
    if origin.kind == "run" and state.is_file():
        record["step"] = read_json(state).get("step")
    tokenizer = bundle.tokenizer
    check_finite(model, f"--init-from {path}", advice="start from another source")
    record["tokenizer"] = tokenizer.to_dict()["kind"] if tokenizer is not None else None
    return Source(model if scheme_of(model) else model.float(), tokenizer, record)


def source_model(source: Source, config: GPTConfig, where: str) -> GPT:
    """A GPT of `config` holding SOURCE's tensors as they are (built on the meta device: no
    random draw, no second copy); a quantized source is its own model."""
    if scheme_of(source.model) is not None:
        if config != source.model.config:
            raise LaminaError(f"{where}: a quantized base keeps its own config (drop --dropout)")
        return source.model
    with torch.device("meta"):
        model = GPT(config)
    assign_state(model, source.model.state_dict(), where)
    return model


def source_config(source: Source, overrides: dict[str, Any]) -> GPTConfig:
    """SOURCE's model config with the free fields overridden; a shape change is refused."""
    config = source.model.config
    free = {}
    for name, value in overrides.items():
        have = getattr(config, name, None)
        if name in FREE_FIELDS:
            free[name] = value
        elif have != value:
            raise LaminaError(
                f"--{name.replace('_', '-')} {value!r} disagrees with --init-from "
                f"{source.record['source']}, whose {name} is {have!r}; the model's shape comes "
                "from SOURCE"
            )
    return config.replace(**free) if free else config


def _names(spec: str, folder: str) -> bool:
    """Whether a --tokenizer spec names `folder` itself (then it is no contradiction)."""
    return Path(spec).exists() and Path(spec).resolve() == Path(folder).resolve()


def source_tokenizer(source: Source, spec: str | None) -> Tokenizer:
    """SOURCE's tokenizer; for a source without one, `spec` if it fixes a matching vocabulary."""
    vocab = source.model.config.vocab_size
    if source.tokenizer is not None:
        if spec not in (None, "char") and not _names(spec, source.record["source"]):
            raise LaminaError(
                f"--tokenizer {spec} would be ignored: --init-from {source.record['source']} "
                "brings its own tokenizer; drop --tokenizer"
            )
        if int(source.tokenizer.vocab_size) > vocab:
            raise LaminaError(
                f"--init-from {source.record['source']}: its tokenizer has "
                f"{source.tokenizer.vocab_size} ids, more than the model's vocab_size {vocab}"
            )
        return source.tokenizer
    if spec is None or spec == "char" or spec.startswith("bpe:"):
        raise LaminaError(
            f"--init-from {source.record['source']} has no tokenizer.json; pass --tokenizer "
            f"byte or gpt2:DIR (a fixed vocabulary of at most {vocab} ids)"
        )
    tok = build_tokenizer(spec)
    if int(tok.vocab_size) > vocab:
        raise LaminaError(
            f"--tokenizer {spec} has {tok.vocab_size} ids, more than --init-from's vocab_size "
            f"{vocab}"
        )
    return tok

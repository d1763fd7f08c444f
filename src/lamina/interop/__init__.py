"""Interop: lamina models and tokenizers to and from other ecosystems' files.

    lamina.open(source) -> Bundle                   any model: lamina run/model folder, Hugging
                                                    Face folder, GGUF file (``bundle``)

    lamina.from_hf(dir) -> GPT                      a Hugging Face checkpoint folder in
    lamina.save_hf(model, dir, tokenizer=None)      and out (with the tokenizer's HF files)

``hf_gpt2``: GPT-2 checkpoint folders (`load_hf_gpt2`, `save_hf_gpt2`). ``hf_llama``: Llama
folders and their family: Mistral, Qwen2, Qwen3 (`load_hf_llama`, `save_hf_llama`). `from_hf`
reads config.json's `model_type` (llama, mistral, qwen2, qwen3 go to the Llama converter,
anything else to GPT-2's, which names what it refuses); `save_hf`
writes a rotary model (positions="rope") as a Llama and any other as GPT-2. ``lamina.tokenizers.hf_files``:
the tokenizer files that go with them. ``gguf``: llama.cpp's GGUF files in and out (`load_gguf`,
`save_gguf`, `read_gguf`; parsing in ``gguf_file``, writing in ``gguf_write``). ``tensor_map``:
the one table of tensor names (lamina against HF GPT-2, HF Llama and GGUF) with its checker. This package sits above the models and data layers and
uses both; nothing below imports it (so the models carry no `from_hf` method: that would be an
upward import). The `transformers` package is never needed here (only the tests use it).
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from lamina.checkpoint import unwrap
from lamina.files import read_json
from lamina.interop.gguf import load_gguf, read_gguf, save_gguf
from lamina.interop.hf_gpt2 import config_from_hf, hf_config, load_hf_gpt2, save_hf_gpt2
from lamina.interop.hf_llama import (
    FAMILIES,
    config_from_hf_llama,
    hf_llama_config,
    load_hf_llama,
    save_hf_llama,
)
from lamina.models.gpt import GPT
from lamina.tokenizers.kinds import Tokenizer

__all__ = [
    "config_from_hf",
    "config_from_hf_llama",
    "from_hf",
    "hf_config",
    "hf_llama_config",
    "is_llama",
    "load_gguf",
    "load_hf_gpt2",
    "load_hf_llama",
    "read_gguf",
    "save_gguf",
    "save_hf",
    "save_hf_gpt2",
    "save_hf_llama",
]


def is_llama(model: nn.Module) -> bool:
    """Whether `save_hf` writes this model as a Llama (a rotary lamina GPT) rather than GPT-2."""
    inner = unwrap(model)
    return isinstance(inner, GPT) and inner.config.positions == "rope"


def from_hf(path: str | os.PathLike[str]) -> GPT:
    """Load a Hugging Face checkpoint folder (config.json + weights) as a lamina model (the
    model only: `lamina.open` gives it with its tokenizer)."""
    config = Path(path) / "config.json"
    if config.is_file():
        data = read_json(config)
        if isinstance(data, dict) and data.get("model_type") in FAMILIES:
            return load_hf_llama(path)
    return load_hf_gpt2(path)


def save_hf(
    model: nn.Module, path: str | os.PathLike[str], tokenizer: Tokenizer | None = None
) -> Path:
    """Write a folder that ``transformers`` loads with ``from_pretrained``; returns its path."""
    if is_llama(model):
        return save_hf_llama(model, path, tokenizer)
    return save_hf_gpt2(model, path, tokenizer)

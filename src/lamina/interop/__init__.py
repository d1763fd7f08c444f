"""Interop: lamina models and tokenizers to and from other ecosystems' files.

    lamina.from_hf(dir) -> GPT                      a Hugging Face checkpoint folder in
    lamina.save_hf(model, dir, tokenizer=None)      and out (with the tokenizer's HF files)

``hf_gpt2``: GPT-2 checkpoint folders (`load_hf_gpt2`, `save_hf_gpt2`). ``hf_tokenizer``: the
tokenizer files that go with them. This package sits above the models and data layers and uses
both; nothing below imports it (so the models carry no `from_hf` method: that would be an
upward import). The `transformers` package is never needed here (only the tests use it).
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from lamina.data.tokenizers import Tokenizer
from lamina.interop.hf_gpt2 import config_from_hf, hf_config, load_hf_gpt2, save_hf_gpt2
from lamina.models.gpt import GPT

__all__ = ["config_from_hf", "from_hf", "hf_config", "load_hf_gpt2", "save_hf", "save_hf_gpt2"]


def from_hf(path: str | os.PathLike[str]) -> GPT:
    """Load a Hugging Face checkpoint folder (config.json + weights) as a lamina model."""
    return load_hf_gpt2(path)


def save_hf(
    model: nn.Module, path: str | os.PathLike[str], tokenizer: Tokenizer | None = None
) -> Path:
    """Write a folder that ``transformers`` loads with ``from_pretrained``; returns its path."""
    return save_hf_gpt2(model, path, tokenizer)

"""Interop: lamina models and tokenizers to and from other ecosystems' files.

    lamina.open(source) -> Bundle                   any model: lamina run/model folder, Hugging
                                                    Face folder, GGUF file (``bundle``)

    lamina.from_hf(dir) -> GPT                      a Hugging Face checkpoint folder in
    lamina.save_hf(model, dir, tokenizer=None)      and out (with the tokenizer's HF files)

``families``: one record per model family (GPT-2, Llama 1-3.x, Mistral, Qwen2/2.5, Qwen3,
Gemma 2, Gemma 3, Phi-3/Phi-4-mini): its config names in config.json and GGUF, its tensor names
in both, its layer options and rope kinds; every converter below is derived from it.
``hf_family``: Hugging Face folders of every family in and out (`from_hf`, `save_hf`: the
first family that expresses the model is written). ``lamina.tokenizers.hf_files``: the
tokenizer files that go with them. ``gguf``: llama.cpp's GGUF files in and out (`load_gguf`, `save_gguf`,
`read_gguf`; parsing in ``lamina.native.gguf_read``, writing in ``gguf_write``, metadata in
``family_gguf``). ``tensor_map``: the one mechanism of tensor names with its checker.
This package sits above the models and data layers and uses both; nothing below imports it
(so the models carry no `from_hf` method: that would be an
upward import). The `transformers` package is never needed here (only the tests use it).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from lamina.lazy import lazy_names

if TYPE_CHECKING:  # loaded on first use (PEP 562), so that the torch-free modules below
    # (discover: the model specs every verb resolves) import without torch
    from lamina.interop.gguf import load_gguf, read_gguf, save_gguf
    from lamina.interop.hf_family import config_from_hf, hf_config, load_hf, save_hf
    from lamina.models.gpt import GPT

lazy_names(
    __name__,
    {
        "load_gguf": "lamina.interop.gguf",
        "read_gguf": "lamina.interop.gguf",
        "save_gguf": "lamina.interop.gguf",
        "config_from_hf": "lamina.interop.hf_family",
        "hf_config": "lamina.interop.hf_family",
        "load_hf": "lamina.interop.hf_family",
        "save_hf": "lamina.interop.hf_family",
    },
)

__all__ = [
    "config_from_hf",
    "from_hf",
    "hf_config",
    "load_gguf",
    "load_hf",
    "read_gguf",
    "save_gguf",
    "save_hf",
]


def from_hf(path: str | os.PathLike[str]) -> GPT:
    """Load a Hugging Face checkpoint folder (config.json + weights) as a lamina model (the
    model only: `lamina.open` gives it with its tokenizer)."""
    from lamina.interop.hf_family import load_hf

    return load_hf(path)

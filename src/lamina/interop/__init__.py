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
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded on first use (PEP 562), so that the torch-free modules below
    # (discover: the model specs every verb resolves) import without torch
    from lamina.interop.gguf import load_gguf, read_gguf, save_gguf
    from lamina.interop.hf_family import config_from_hf, hf_config, load_hf, save_hf
    from lamina.models.gpt import GPT

_LAZY = {
    "load_gguf": "lamina.interop.gguf",
    "read_gguf": "lamina.interop.gguf",
    "save_gguf": "lamina.interop.gguf",
    "config_from_hf": "lamina.interop.hf_family",
    "hf_config": "lamina.interop.hf_family",
    "load_hf": "lamina.interop.hf_family",
    "save_hf": "lamina.interop.hf_family",
}

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


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lamina.interop' has no attribute {name!r}")


class _Package(types.ModuleType):
    """Keeps a lazy name (`hf_config`, the function) from being rebound to the submodule of the
    same name when that submodule is imported (the eager imports did the same by ordering)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def from_hf(path: str | os.PathLike[str]) -> GPT:
    """Load a Hugging Face checkpoint folder (config.json + weights) as a lamina model (the
    model only: `lamina.open` gives it with its tokenizer)."""
    from lamina.interop.hf_family import load_hf

    return load_hf(path)

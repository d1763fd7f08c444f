"""Interop: lamina models and tokenizers to and from other ecosystems' files.

``hf_gpt2``: Hugging Face GPT-2 checkpoint folders in (`load_hf_gpt2`, also `lamina.GPT.from_hf`)
and out (`save_hf_gpt2`, also `GPT.save_hf`). ``hf_tokenizer``: the tokenizer files that go
with them. This package sits above the models and data layers and uses both; nothing below
imports it. The `transformers` package is never needed here (only the tests use it).
"""

from __future__ import annotations

from lamina.interop.hf_gpt2 import config_from_hf, hf_config, load_hf_gpt2, save_hf_gpt2

__all__ = ["config_from_hf", "hf_config", "load_hf_gpt2", "save_hf_gpt2"]

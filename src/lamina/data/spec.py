"""Tokenizer specs: the strings `lamina train --tokenizer` accepts, turned into tokenizers.

    "char"       a CharTokenizer built from the corpus text

Other kinds register here as they are added. Deliberately unaware of models and training.
"""

from __future__ import annotations

from lamina.data.tokenizers import CharTokenizer, Tokenizer
from lamina.errors import LaminaError

TOKENIZER_SPECS = ("char",)


def build_tokenizer(spec: str, text: str | None = None) -> Tokenizer:
    """A tokenizer from a spec string; `text` is the corpus (needed by kinds learned from it)."""
    if spec == "char":
        if text is None:
            raise LaminaError("tokenizer 'char' is built from the corpus: pass its text")
        return CharTokenizer.from_text(text)
    raise LaminaError(f"unknown tokenizer {spec!r}; choose from {', '.join(TOKENIZER_SPECS)}")

"""Tokenizer specs: the strings `lamina train --tokenizer` accepts, turned into tokenizers.

    "char"       a CharTokenizer built from the corpus text (one id per distinct character)
    "byte"       a ByteTokenizer: the 256 UTF-8 byte values, any text round-trips
    "bpe:N"      byte-level BPE with at most N ids (N >= 257) trained on the corpus text
    "gpt2:DIR"   GPT-2's BPE (50,257 ids) from encoder.json + vocab.bpe in DIR, sha256 checked
    PATH         a tokenizer.json file, or a run / model folder holding one: that tokenizer as
                 saved (so `--tokenizer RUN` reuses a run's vocabulary)

`build_tokenizer` is the one resolver of a spec: `lamina train` (language models and
classifiers), `lamina prepare` and the token cache all go through it. `saved_tokenizer(spec)`
is its PATH half, for callers that fit a kind their own way (prepare streams char and bpe:N).

Training "bpe:N" on a corpus of 1 MB or more prints a few progress lines to stderr ("bpe: ...")
unless a `progress` callable is given (`progress=lambda line: None` silences it).

Deliberately unaware of models and training; reads no file other than a gpt2 DIR's two files
and a PATH spec's tokenizer.json.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from lamina.errors import LaminaError
from lamina.tokenizers.kinds import CharTokenizer, Tokenizer, load_tokenizer
from lamina.tokenizers.subword import BPETokenizer, ByteTokenizer, GPT2Tokenizer

TOKENIZER_SPECS = ("char", "byte", "bpe:N", "gpt2:DIR", "a tokenizer.json or run folder")
PROGRESS_FROM_CHARS = 1_000_000  # below this, training bpe takes under a second: no progress


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def is_kind(spec: str) -> bool:
    """Whether `spec` names a kind (char, byte, bpe:N, gpt2:DIR) rather than a saved file."""
    kind, sep, _ = spec.partition(":")
    return spec in ("char", "byte") or (bool(sep) and kind in ("bpe", "gpt2"))


def saved_tokenizer(spec: str) -> Tokenizer | None:
    """The tokenizer a PATH spec names (a tokenizer.json, or a folder holding one); None for a
    kind spec or a path that does not exist (then `build_tokenizer` names the spec as unknown)."""
    if not isinstance(spec, str) or is_kind(spec):
        return None
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "tokenizer.json").is_file():
            raise LaminaError(f"--tokenizer {spec}: that folder holds no tokenizer.json")
        return load_tokenizer(p / "tokenizer.json")
    if p.is_file():
        return load_tokenizer(p)
    return None


def build_tokenizer(
    spec: str, text: str | None = None, progress: Callable[[str], None] | None = None
) -> Tokenizer:
    """A tokenizer from a spec string; `text` is the corpus (needed by kinds learned from it).

    `progress(line)` receives bpe training's progress lines (default: stderr for a corpus of
    1 MB or more, nothing below).
    """
    if not isinstance(spec, str):
        raise LaminaError(f"tokenizer spec must be a string, got {type(spec).__name__}")
    saved = saved_tokenizer(spec)
    if saved is not None:
        return saved
    kind, sep, arg = spec.partition(":")
    if spec == "char":
        if text is None:
            raise LaminaError("tokenizer 'char' is built from the corpus: pass its text")
        return CharTokenizer.from_text(text)
    if spec == "byte":
        return ByteTokenizer()
    if kind == "bpe" and sep:
        if not arg.isdigit():
            raise LaminaError(f"tokenizer {spec!r}: N in 'bpe:N' must be a whole number of ids")
        if text is None:
            raise LaminaError(f"tokenizer {spec!r} is trained on the corpus: pass its text")
        if progress is None and len(text) >= PROGRESS_FROM_CHARS:
            progress = _to_stderr
        return BPETokenizer.train(text, int(arg), progress)
    if kind == "gpt2" and sep:
        if not arg:
            raise LaminaError(
                "tokenizer 'gpt2:DIR' needs the folder holding encoder.json and vocab.bpe"
            )
        return GPT2Tokenizer.from_dir(arg)
    raise LaminaError(f"unknown tokenizer {spec!r}; choose from {', '.join(TOKENIZER_SPECS)}")

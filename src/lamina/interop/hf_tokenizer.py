"""Tokenizer files of a Hugging Face model folder <-> lamina's gpt2 and bpe tokenizers.

    tokenizer_from_hf(dir) -> Tokenizer | None
        merges.txt with GPT-2's sha256 (and vocab.json, if present, matching it) -> GPT2Tokenizer;
        else a byte-level BPE tokenizer.json -> BPETokenizer; else None (no tokenizer we know).
    save_hf_tokenizer(tokenizer, dir) -> list of file names written
        GPT2Tokenizer -> vocab.json + merges.txt + tokenizer_config.json (GPT2Tokenizer class);
        BPETokenizer  -> tokenizer.json + tokenizer_config.json (PreTrainedTokenizerFast);
        other kinds   -> nothing (Hugging Face has no equivalent; the caller says so).

Deliberately unaware of models and weights; never imports transformers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lamina.data.subword import EOT, GPT2_SHA256, BPETokenizer, GPT2Tokenizer
from lamina.data.tokenizers import Tokenizer
from lamina.errors import LaminaError
from lamina.files import atomic_write, write_json


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_bytes())
    except ValueError as e:
        raise LaminaError(f"{path} is not valid JSON: {e}") from e


def tokenizer_from_hf(directory: str | Path) -> Tokenizer | None:
    """The tokenizer a Hugging Face GPT-2 folder ships, if it is GPT-2's BPE or byte-level BPE."""
    d = Path(directory)
    merges = d / "merges.txt"
    if merges.is_file():
        raw = merges.read_bytes()
        if hashlib.sha256(raw).hexdigest() == GPT2_SHA256["vocab.bpe"]:
            tok = GPT2Tokenizer(raw.decode("utf-8"))
            vocab = d / "vocab.json"
            if vocab.is_file() and _read_json(vocab) != tok.encoder():
                raise LaminaError(f"{vocab} does not match GPT-2's merges in {merges}")
            return tok
    hf_json = d / "tokenizer.json"
    if hf_json.is_file():
        try:
            return BPETokenizer(hf_json.read_bytes().decode("utf-8"))
        except (LaminaError, UnicodeDecodeError):
            return None  # some other kind of tokenizer: not ours to convert
    return None


def save_hf_tokenizer(tokenizer: Tokenizer, directory: str | Path) -> list[str]:
    """Write the files a Hugging Face AutoTokenizer loads; returns their names ([] if none)."""
    d = Path(directory)
    if isinstance(tokenizer, GPT2Tokenizer):
        vocab = json.dumps(tokenizer.encoder(), ensure_ascii=False).encode("utf-8")
        merges = tokenizer.merges.encode("utf-8")
        atomic_write(d / "vocab.json", lambda f: f.write(vocab))
        atomic_write(d / "merges.txt", lambda f: f.write(merges))
        config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False}
        config.update(bos_token=EOT, eos_token=EOT, unk_token=EOT)
        write_json(d / "tokenizer_config.json", config)
        return ["vocab.json", "merges.txt", "tokenizer_config.json"]
    if isinstance(tokenizer, BPETokenizer):
        payload = tokenizer.hf_json.encode("utf-8")
        atomic_write(d / "tokenizer.json", lambda f: f.write(payload))
        config = {"tokenizer_class": "PreTrainedTokenizerFast"}
        if EOT in tokenizer.special_tokens:
            config.update(bos_token=EOT, eos_token=EOT)
        write_json(d / "tokenizer_config.json", config)
        return ["tokenizer.json", "tokenizer_config.json"]
    return []

"""Tokenizer files of a Hugging Face model folder <-> lamina's gpt2 and bpe tokenizers.

    tokenizer_from_hf(dir, vocab_size=None) -> Tokenizer | None
        merges.txt with GPT-2's sha256 (and vocab.json, if present, matching it) -> GPT2Tokenizer;
        else a byte-level BPE tokenizer.json -> BPETokenizer; else None.
    save_hf_tokenizer(tokenizer, dir) -> list of file names written
        GPT2Tokenizer -> vocab.json + merges.txt + tokenizer_config.json (GPT2Tokenizer class);
        BPETokenizer  -> tokenizer.json + tokenizer_config.json (PreTrainedTokenizerFast);
        other kinds   -> nothing (Hugging Face has no equivalent; the caller says so).

Nothing is dropped without a word. Tokenizer files that are broken (vocab.json, tokenizer.json
or merges.txt that is not UTF-8 or not the JSON it should be) are refused with a `LaminaError`
naming the file. Well-formed files of a kind lamina does not convert (a WordPiece or Unigram
tokenizer.json, a merges.txt that is not GPT-2's, a vocab.json with no merges.txt) give a
`LaminaWarning` naming the file and why, and the model converts without a tokenizer. With
`vocab_size` (the model's), a tokenizer with more ids than that is refused: its extra ids
would have no embedding.

Deliberately unaware of models and weights; never imports transformers.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

from lamina.data.subword import EOT, GPT2_SHA256, BPETokenizer, GPT2Tokenizer
from lamina.data.tokenizers import Tokenizer
from lamina.errors import LaminaError, LaminaWarning
from lamina.files import atomic_write, write_json


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise LaminaError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(_read_text(path))
    except ValueError as e:
        raise LaminaError(f"{path} is not valid JSON: {e}") from None


def _skip(path: Path, why: str) -> None:
    warnings.warn(f"{path} not converted: {why}", LaminaWarning, stacklevel=3)


def _check_vocab_json(path: Path) -> dict[str, Any]:
    vocab = _read_json(path)
    if not isinstance(vocab, dict) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in vocab.values()
    ):
        raise LaminaError(f"{path} is not a vocabulary: expected a JSON object of token -> id >= 0")
    return vocab


def _type(part: Any) -> str | None:
    return part.get("type") if isinstance(part, dict) else None


def _from_files(d: Path) -> Tokenizer | None:
    merges, vocab, hf_json = d / "merges.txt", d / "vocab.json", d / "tokenizer.json"
    vocab_data = _check_vocab_json(vocab) if vocab.is_file() else None
    if merges.is_file():
        raw = merges.read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        if digest == GPT2_SHA256["vocab.bpe"]:
            tok = GPT2Tokenizer(raw.decode("utf-8"))
            if vocab_data is not None and vocab_data != tok.encoder():
                raise LaminaError(f"{vocab} does not match GPT-2's merges in {merges}")
            return tok
        _read_text(merges)
    if hf_json.is_file():
        layout = _read_json(hf_json)
        if not isinstance(layout, dict) or not isinstance(layout.get("model"), dict):
            raise LaminaError(f"{hf_json} is not a Hugging Face tokenizer (no 'model' object)")
        parts = [_type(layout.get(k)) for k in ("model", "pre_tokenizer", "decoder")]
        if parts == ["BPE", "ByteLevel", "ByteLevel"]:
            return BPETokenizer(_read_text(hf_json))  # a broken one raises, naming `tokenizers`
        kind = parts[0] or "untyped"
        _skip(
            hf_json,
            f"a {kind} tokenizer (pre-tokenizer {parts[1]}, decoder {parts[2]}); lamina converts "
            "GPT-2's BPE and byte-level BPE only",
        )
    elif merges.is_file():
        _skip(
            merges,
            f"not GPT-2's merges (sha256 {digest[:12]}..., GPT-2's is "
            f"{GPT2_SHA256['vocab.bpe'][:12]}...), and there is no tokenizer.json; lamina "
            "converts GPT-2's own merges.txt only",
        )
    elif vocab_data is not None:
        _skip(
            vocab,
            "no merges.txt or tokenizer.json beside it, and a vocabulary alone is not a "
            "tokenizer lamina converts",
        )
    return None


def tokenizer_from_hf(directory: str | Path, vocab_size: int | None = None) -> Tokenizer | None:
    """The tokenizer a Hugging Face folder ships, if it is GPT-2's BPE or byte-level BPE.

    None if it ships none we convert (a `LaminaWarning` says which file was left and why);
    `LaminaError` if a tokenizer file is broken, or has more ids than `vocab_size`.
    """
    tok = _from_files(Path(directory))
    if tok is not None and vocab_size is not None and tok.vocab_size > vocab_size:
        raise LaminaError(
            f"the tokenizer in {directory} has {tok.vocab_size:,} ids, more than the model's "
            f"vocab_size {vocab_size:,}: ids {vocab_size:,} and up would have no embedding"
        )
    return tok


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

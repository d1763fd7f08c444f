"""Tokenizer files of a Hugging Face model folder <-> lamina tokenizers.

    tokenizer_from_hf(dir, vocab_size=None) -> Tokenizer | None
        merges.txt with GPT-2's sha256 (and vocab.json, if present, matching it) -> GPT2Tokenizer;
        else any tokenizer.json (byte-level BPE, sentencepiece BPE, Unigram, WordPiece...) with
        its tokenizer_config.json & co -> PretrainedTokenizer; else None.
    save_hf_tokenizer(tokenizer, dir) -> list of file names written
        GPT2Tokenizer       -> vocab.json + merges.txt + tokenizer_config.json (GPT2Tokenizer);
        BPETokenizer        -> tokenizer.json + tokenizer_config.json (PreTrainedTokenizerFast);
        PretrainedTokenizer -> tokenizer.json + tokenizer_config.json with its special tokens,
                               add_bos_token and chat template (+ generation_config.json with
                               the end-of-turn ids, when there are more than eos);
        other kinds         -> nothing (Hugging Face has no equivalent; the caller says so).

Nothing is dropped without a word. Tokenizer files that are broken (vocab.json, tokenizer.json
or merges.txt that is not UTF-8 or not the JSON it should be, a tokenizer.json `tokenizers`
cannot run) are refused with a `LaminaError` naming the file. Files lamina does not convert (a
merges.txt that is not GPT-2's with no tokenizer.json, a vocab.json with no merges.txt) give a
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

from lamina.errors import LaminaError, LaminaWarning
from lamina.files import atomic_write, write_json
from lamina.tokenizers.kinds import Tokenizer
from lamina.tokenizers.pretrained import PretrainedTokenizer
from lamina.tokenizers.subword import EOT, GPT2_SHA256, BPETokenizer, GPT2Tokenizer


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
        return PretrainedTokenizer.from_hf_folder(d)
    if merges.is_file():
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
    """The tokenizer a Hugging Face folder ships: GPT-2's BPE, or any tokenizer.json.

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
    if isinstance(tokenizer, PretrainedTokenizer):
        return _save_pretrained(tokenizer, d)
    return []


def _save_pretrained(tokenizer: PretrainedTokenizer, d: Path) -> list[str]:
    payload = tokenizer.hf_json.encode("utf-8")
    atomic_write(d / "tokenizer.json", lambda f: f.write(payload))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for role in ("bos", "eos", "pad", "unk"):
        text = tokenizer.token_text(getattr(tokenizer, f"{role}_id"))
        if text is not None:
            config[f"{role}_token"] = text
    config["add_bos_token"] = tokenizer.add_bos
    if tokenizer.chat_template is not None:
        config["chat_template"] = tokenizer.chat_template
    write_json(d / "tokenizer_config.json", config)
    names = ["tokenizer.json", "tokenizer_config.json"]
    eos = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
    if list(tokenizer.eot_ids) != eos:
        write_json(d / "generation_config.json", {"eos_token_id": list(tokenizer.eot_ids)})
        names.append("generation_config.json")
    return names

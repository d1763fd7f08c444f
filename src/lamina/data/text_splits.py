"""A corpus cut into training and validation *text*, tokenized once and cached on disk.

    split_text(text, val_fraction) -> (train_text, val_text)
        the last val_fraction of the characters is validation: n = int(len(text) * (1 - f)),
        the rounding `corpus.split_tokens` uses, so a char tokenizer splits as it always did
    text_splits(spec, text, val_fraction, tokenizer=None) -> TextSplits
        the tokenizer (given, or built from `spec` by `spec.build_tokenizer`: "char" from the
        whole text so every character has an id; "bpe:N" fit on the training text only;
        "byte" / "gpt2:DIR" / a saved tokenizer.json or run folder fixed),
        the token arrays of both parts, and the validation characters the model is scored on
    cache_root() -> Path | None      $LAMINA_CACHE, else ~/.cache/lamina (XDG_CACHE_HOME); None
                                     when LAMINA_CACHE is "off"

Cutting the text before tokenizing means every tokenizer is validated on the same characters, so
a loss per character (total next-token loss / `TextSplits.val_chars`) compares tokenizers fairly.
`val_chars` counts the characters the scored tokens cover: the validation text less the
characters of its first token, which no window predicts (for a char tokenizer: val tokens - 1,
so nats per character equal nats per token there).

The cache: `<root>/tokens/<sha256 of the text, 16 hex>-<sha256 of (tokenizer spec or its JSON,
val_fraction), 12 hex>/` holds tokenizer.json, train.npy, val.npy and meta.json (written last,
each file atomically; meta.json records the lengths, the sha256 of the text it was derived
from, of the tokenizer and of each array's bytes, all checked on use). An entry that is
incomplete or disagrees with its meta.json is ignored and rewritten (a damaged one with a
warning: a train.npy of the right length but other bytes is caught by its hash); a cache that cannot be
written is skipped with a warning. The char tokenizer skips the cache (it is fast).

"bpe:N" whose training text runs out of pairs (seen at least twice) before N ids is refused in
one line naming N and the ids the text supports.

Deliberately unaware of models, windows and training.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lamina.data.corpus import encode_corpus, load_tokens, save_tokens
from lamina.data.spec import build_tokenizer, saved_tokenizer
from lamina.errors import LaminaError, LaminaWarning
from lamina.files import write_json
from lamina.tokenizers.kinds import Tokenizer, load_tokenizer, save_tokenizer

CACHE_ENV = "LAMINA_CACHE"
CACHE_VERSION = 2  # 2: meta.json holds the sha256 of the text and of each array


@dataclass
class TextSplits:
    tokenizer: Tokenizer
    train: np.ndarray
    val: np.ndarray
    val_chars: int  # characters covered by the predicted validation tokens (see above)
    cached: bool = False  # read back from the cache


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """(train, val) text: val is the last `val_fraction` of the characters."""
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)):
        raise LaminaError(f"val_fraction must be a number, got {val_fraction!r}")
    if not 0.0 <= val_fraction < 1.0:
        raise LaminaError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n = int(len(text) * (1 - val_fraction))
    return text[:n], text[n:]


def scored_chars(tokenizer: Tokenizer, val_text: str, val: np.ndarray) -> int:
    """Characters of `val_text` after its first token (the ones next-token loss predicts)."""
    if len(val) == 0:
        return 0
    first = len(tokenizer.decode([int(val[0])]))
    return max(1, len(val_text) - first)


def cache_root() -> Path | None:
    raw = os.environ.get(CACHE_ENV)
    if raw is not None:
        return None if raw.strip().lower() in ("off", "0", "") else Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "lamina"


def _sha(data: str | bytes) -> str:
    raw = data.encode("utf-8", errors="surrogatepass") if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()


def _tok_json(tok: Tokenizer) -> str:
    return json.dumps(tok.to_dict(), sort_keys=True, ensure_ascii=False)


def _entry(text: str, key: str, val_fraction: float) -> Path | None:
    root = cache_root()
    if root is None:
        return None
    spec_hash = _sha(f"v{CACHE_VERSION}|{key}|{float(val_fraction)!r}")[:12]
    return root / "tokens" / f"{_sha(text)[:16]}-{spec_hash}"


def _array_sha(a: np.ndarray) -> str:
    return _sha(f"{a.dtype.str}:{a.shape}|".encode() + np.ascontiguousarray(a).tobytes())


def _read(entry: Path, text: str) -> TextSplits | None:
    """The cached splits, or None if the entry is missing, incomplete or inconsistent (a
    damaged entry, one whose meta.json is there but disagrees, is named in a warning)."""
    if not (entry / "meta.json").is_file():
        return None
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or meta.get("version") != CACHE_VERSION:
            return None  # an older lamina's entry: rewritten without a word
        tok = load_tokenizer(entry / "tokenizer.json")
        train, val = load_tokens(entry / "train.npy"), load_tokens(entry / "val.npy")
        ok = (
            meta.get("text") == _sha(text)
            and meta.get("tokenizer") == _sha(_tok_json(tok))
            and meta.get("train_tokens") == len(train)
            and meta.get("val_tokens") == len(val)
            and meta.get("train_sha256") == _array_sha(train)
            and meta.get("val_sha256") == _array_sha(val)
            and isinstance(meta.get("val_chars"), int)
            and (len(train) == 0 or int(max(train.max(), val.max(initial=0))) < tok.vocab_size)
        )
        if ok:
            return TextSplits(tok, train, val, int(meta["val_chars"]), cached=True)
    except (OSError, ValueError, KeyError, TypeError, LaminaError):
        pass
    warnings.warn(
        f"the token cache entry {entry} is damaged (it disagrees with its meta.json); "
        "tokenizing again",
        LaminaWarning,
        stacklevel=3,
    )
    return None


def _write(entry: Path, s: TextSplits, text: str) -> None:
    try:
        entry.mkdir(parents=True, exist_ok=True)
        (entry / "meta.json").unlink(missing_ok=True)  # the entry is invalid until written
        save_tokenizer(s.tokenizer, entry / "tokenizer.json")
        save_tokens(entry / "train.npy", s.train)
        save_tokens(entry / "val.npy", s.val)
        meta = {
            "version": CACHE_VERSION,
            "text": _sha(text),
            "tokenizer": _sha(_tok_json(s.tokenizer)),
            "train_sha256": _array_sha(s.train),
            "val_sha256": _array_sha(s.val),
            "train_tokens": len(s.train),
            "val_tokens": len(s.val),
            "val_chars": s.val_chars,
        }
        write_json(entry / "meta.json", meta)
    except (OSError, LaminaError) as e:
        warnings.warn(
            f"cannot write the token cache {entry} ({e}); set {CACHE_ENV}=off to skip it",
            LaminaWarning,
            stacklevel=3,
        )


def _fit(spec: str, train_text: str) -> Tokenizer:
    tok = build_tokenizer(spec, train_text)
    kind, _, arg = spec.partition(":")
    if kind == "bpe" and arg.isdigit() and tok.vocab_size < int(arg):
        raise LaminaError(
            f"--tokenizer {spec}: the training text ({len(train_text):,} characters) supports "
            f"only {tok.vocab_size} ids (no pair left that occurs twice); use bpe:"
            f"{tok.vocab_size} or fewer, or more text"
        )
    return tok


def text_splits(
    spec: str, text: str, val_fraction: float, tokenizer: Tokenizer | None = None
) -> TextSplits:
    """Tokenizer and (train, val) tokens of `text` cut by characters; cached unless char."""
    train_text, val_text = split_text(text, val_fraction)
    tokenizer = tokenizer or saved_tokenizer(spec)  # a PATH spec: cached by its JSON, not its name
    if (tokenizer is None and spec == "char") or getattr(tokenizer, "kind", "") == "char":
        # one id per character: encoding the whole text and cutting at the same index is the
        # same split, and an unknown character is named by its position in the corpus
        tok = tokenizer or build_tokenizer("char", text)
        ids = encode_corpus(tok, text)
        train, val = ids[: len(train_text)], ids[len(train_text) :]
        return TextSplits(tok, train, val, scored_chars(tok, val_text, val))
    key = f"spec:{spec}" if tokenizer is None else f"json:{_sha(_tok_json(tokenizer))}"
    entry = _entry(text, key, val_fraction)
    if entry is not None:
        hit = _read(entry, text)
        if hit is not None:
            return hit
    tok = tokenizer or _fit(spec, train_text)
    splits = _encode(tok, train_text, val_text)
    if entry is not None:
        _write(entry, splits, text)
    return splits


def _encode(tok: Tokenizer, train_text: str, val_text: str) -> TextSplits:
    train, val = encode_corpus(tok, train_text), encode_corpus(tok, val_text)
    return TextSplits(tok, train, val, scored_chars(tok, val_text, val))

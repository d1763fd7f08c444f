"""Corpora on disk -> one string -> a 1-D array of token ids -> train/validation splits.

In and out:
    ``load_corpus(path) -> str``: a UTF-8 file, or a folder whose files are joined with one
    ``"\\n"`` between files, sorted by path. Bytes are decoded as they are: no newline
    translation, no Unicode normalisation; only a leading UTF-8 byte-order mark is dropped.
    ``corpus_files(folder) -> (files, skipped)``: the files a folder contributes, and each
    entry left out with the reason.
    ``token_dtype(vocab_size) -> np.dtype``: uint8 / uint16 / uint32, the smallest that holds
    every id ``0 .. vocab_size - 1``.
    ``encode_corpus(tokenizer, text) -> np.ndarray``: shape ``(n_tokens,)``, that dtype.
    ``split_tokens(tokens, val_fraction) -> (train, val)``: views, validation is the tail.
    ``save_tokens`` / ``load_tokens``: ``.npy`` files (no pickle), written atomically.

The folder rule is `lamina.data.sources`'s (the one `lamina prepare` follows too): every
.txt, .jsonl, .txt.gz and .jsonl.gz file of the folder's tree, in any case, sorted by relative
path; hidden files and folders, editor lock files, broken symlinks and other files are left out
and named in one ``LaminaWarning``. A .jsonl file's documents are its lines' "text" fields.

What this module deliberately does not know: which tokenizer is used (any object with
``vocab_size`` and ``encode``, optionally ``encode_array``), windows, batches and tensors.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lamina.data.sources import corpus_files as source_files
from lamina.data.sources import read_pieces, scan
from lamina.errors import LaminaError
from lamina.files import atomic_write, kind_of

if TYPE_CHECKING:
    from lamina.tokenizers.kinds import Tokenizer

__all__ = [
    "corpus_files",
    "encode_corpus",
    "load_corpus",
    "load_tokens",
    "save_tokens",
    "split_tokens",
    "token_dtype",
]

_BOM = "\ufeff"


_BLOCK = 1 << 24  # read 16 MiB at a time, so binary input (/dev/zero) is refused at once


def _read_text_file(p: Path) -> str:
    raw = bytearray()
    try:
        with p.open("rb") as f:
            while block := f.read(_BLOCK):
                nul = block.find(b"\x00")
                if nul >= 0:
                    raise LaminaError(
                        f"{p} looks binary (NUL byte at byte offset {len(raw) + nul}); expected "
                        "UTF-8 text"
                    )
                raw += block
    except OSError as e:
        raise LaminaError(f"cannot read {p}: {e.strerror or e}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LaminaError(
            f"{p} is not valid UTF-8: byte {bytes(raw[e.start : e.start + 1])!r} at byte offset "
            f"{e.start} ({e.reason})"
        ) from e
    if text.startswith(_BOM):
        text = text[1:]
    return text


def corpus_files(folder: str | os.PathLike[str]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The files of a corpus folder and the (entry, reason) pairs left out: `sources.scan`,
    the one folder rule."""
    return scan(folder)


def _documents(p: Path) -> list[str]:
    """A .jsonl or .gz file's documents (a .jsonl line's "text"; a .txt.gz whole)."""
    docs, cur = [], []
    for piece, end in read_pieces([p]):
        cur.append(piece)
        if end:
            docs.append("".join(cur))
            cur = []
    return docs


def _file_text(p: Path) -> str:
    if p.name.lower().endswith((".jsonl", ".gz")):
        return "\n".join(_documents(p))
    return _read_text_file(p)


def load_corpus(path: str | os.PathLike[str]) -> str:
    """A UTF-8 text file (a .jsonl or .gz file: its documents joined with "\n"), or a folder's
    files by the folder rule (`sources`), joined with "\n"; each skip named in one warning."""
    p = Path(path)
    files = source_files(p)  # raises for a missing path or a folder with nothing to read
    texts = [_file_text(f) for f in files]
    if sum(len(t) for t in texts) == 0:
        where = f"every file in {p}" if p.is_dir() else str(p)
        raise LaminaError(f"corpus is empty: {where} has zero characters")
    return "\n".join(texts)


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype holding ids ``0 .. vocab_size - 1``: uint8, uint16 or uint32."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
        raise LaminaError(f"vocab_size must be an integer, got {vocab_size!r}")
    vocab_size = int(vocab_size)
    if vocab_size < 1:
        raise LaminaError(f"vocab_size must be at least 1, got {vocab_size}")
    if vocab_size <= 2**8:
        return np.dtype(np.uint8)
    if vocab_size <= 2**16:
        return np.dtype(np.uint16)
    if vocab_size <= 2**32:
        return np.dtype(np.uint32)
    raise LaminaError(f"vocab_size must be at most 2**32, got {vocab_size}")


def encode_corpus(tokenizer: Tokenizer, text: str) -> np.ndarray:
    """Encode ``text`` to a 1-D array of ids in ``token_dtype(tokenizer.vocab_size)``."""
    if not isinstance(text, str):
        raise LaminaError(f"text must be a str, got {type(text).__name__}")
    vocab_size = int(tokenizer.vocab_size)
    dtype = token_dtype(vocab_size)
    encode_array = getattr(tokenizer, "encode_array", None)
    if callable(encode_array):
        ids = np.asarray(encode_array(text))
    else:
        ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
    if ids.ndim != 1:
        raise LaminaError(f"{type(tokenizer).__name__} returned ids of shape {ids.shape}, not 1-D")
    if ids.size:
        if ids.dtype.kind not in "iu":
            raise LaminaError(
                f"{type(tokenizer).__name__} returned ids of dtype {ids.dtype}, not integers"
            )
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise LaminaError(
                f"{type(tokenizer).__name__} produced id {bad}, outside [0, {vocab_size})"
            )
    return ids.astype(dtype, copy=False)


def _check_tokens(tokens: Any, name: str = "tokens") -> np.ndarray:
    if not isinstance(tokens, np.ndarray):
        raise LaminaError(f"{name} must be a numpy array, got {type(tokens).__name__}")
    if tokens.ndim != 1:
        raise LaminaError(f"{name} must be 1-D, got shape {tokens.shape}")
    if tokens.dtype.kind not in "iu":
        raise LaminaError(f"{name} must have an integer dtype, got {tokens.dtype}")
    return tokens


def split_tokens(tokens: np.ndarray, val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Split into (train, val): val is the last ``val_fraction`` of the tokens.

    ``n = int(len(tokens) * (1 - val_fraction))``; train is ``tokens[:n]``, val ``tokens[n:]``
    (both views). 1,115,394 tokens with 0.1 give 1,003,854 / 111,540.
    """
    _check_tokens(tokens)
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float, np.floating)):
        raise LaminaError(f"val_fraction must be a number, got {val_fraction!r}")
    val_fraction = float(val_fraction)
    if not math.isfinite(val_fraction) or not 0.0 <= val_fraction < 1.0:
        raise LaminaError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n = int(len(tokens) * (1 - val_fraction))
    return tokens[:n], tokens[n:]


def save_tokens(path: str | os.PathLike[str], tokens: np.ndarray) -> None:
    """Write a 1-D integer array as ``.npy`` to exactly ``path`` (no suffix added), atomically."""
    _check_tokens(tokens)
    arr = np.ascontiguousarray(tokens)
    atomic_write(path, lambda f: np.save(f, arr, allow_pickle=False))


def load_tokens(path: str | os.PathLike[str], mmap: bool = False) -> np.ndarray:
    """Read an array written by ``save_tokens`` (dtype kept); ``mmap=True`` maps it read-only."""
    p = Path(path)
    if not p.is_file():
        kind = kind_of(p)
        raise LaminaError(f"no such token file: {p}" if kind == "missing" else f"{p} is a {kind}")
    try:
        tokens = np.load(p, allow_pickle=False, mmap_mode="r" if mmap else None)
    except (ValueError, OSError, EOFError) as e:
        raise LaminaError(f"{p} is not a readable .npy token file: {e}") from e
    if not isinstance(tokens, np.ndarray):
        raise LaminaError(f"{p} does not hold a single array")
    return _check_tokens(tokens, name=f"tokens in {p}")

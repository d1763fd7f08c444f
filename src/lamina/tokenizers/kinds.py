"""Tokenizers: text <-> integer ids, plus a registry so every kind saves and loads as JSON.

In and out:
    ``encode(text: str) -> list[int]`` with every id in ``[0, vocab_size)``;
    ``decode(ids: Iterable[int]) -> str``; ``to_dict() -> dict`` (JSON-able, with a
    ``"kind"`` key) and the module functions ``save_tokenizer`` / ``load_tokenizer`` /
    ``tokenizer_from_dict``, which dispatch on ``"kind"`` through ``register_tokenizer``.

``CharTokenizer`` maps each Unicode code point to one id. It also has
``encode_array(text) -> np.ndarray`` (int64, shape ``(len(text),)``), a vectorised path that
encodes a multi-megabyte corpus in well under a second; corpus code prefers it when present.

What this module deliberately does not know: models, tensors, training and batching. Other
tokenizer kinds (byte, BPE, GPT-2) live in other modules and register themselves here; this
module only knows the ``"char"`` kind. It never normalises text (no Unicode normalisation, no
newline translation): what you encode is exactly what you get back.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from lamina.errors import LaminaError
from lamina.files import atomic_write, loads_json

__all__ = [
    "CharTokenizer",
    "check_token_ids",
    "Tokenizer",
    "known_tokenizer_kinds",
    "load_tokenizer",
    "register_tokenizer",
    "save_tokenizer",
    "tokenizer_from_dict",
]


@runtime_checkable
class Tokenizer(Protocol):
    """What every tokenizer offers: ids in ``[0, vocab_size)`` and a JSON form with a kind."""

    @property
    def vocab_size(self) -> int:
        """Number of ids; every id produced by ``encode`` is below it."""
        ...

    @property
    def special_tokens(self) -> dict[str, int]:
        """Role or token name -> id for ids with a special meaning (may be empty)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Text -> ids."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """JSON-able description, including ``"kind"``, that ``tokenizer_from_dict`` inverts."""
        ...


_REGISTRY: dict[str, Callable[[dict[str, Any]], Tokenizer]] = {}


def register_tokenizer(
    kind: str, from_dict: Callable[[dict[str, Any]], Tokenizer], *, replace: bool = False
) -> None:
    """Make ``tokenizer_from_dict`` build tokenizers whose dict has ``"kind": kind``.

    Registering a kind that is already registered with a different function raises
    LaminaError unless ``replace=True`` (registering the same function again is a no-op).
    """
    if not isinstance(kind, str) or not kind:
        raise LaminaError(f"tokenizer kind must be a non-empty string, got {kind!r}")
    if not callable(from_dict):
        raise LaminaError(f"from_dict for tokenizer kind {kind!r} must be callable")
    existing = _REGISTRY.get(kind)
    if existing is not None and existing is not from_dict and not replace:
        raise LaminaError(
            f"tokenizer kind {kind!r} is already registered; pass replace=True to override it"
        )
    _REGISTRY[kind] = from_dict


def known_tokenizer_kinds() -> list[str]:
    """The registered kinds, sorted."""
    return sorted(_REGISTRY)


def tokenizer_from_dict(d: dict[str, Any]) -> Tokenizer:
    """Build a tokenizer from the output of its ``to_dict()``, dispatching on ``d["kind"]``."""
    if not isinstance(d, dict):
        raise LaminaError(f"a tokenizer description must be a dict, got {type(d).__name__}")
    if "kind" not in d:
        raise LaminaError(
            "tokenizer description has no 'kind' field; known kinds: "
            + ", ".join(known_tokenizer_kinds())
        )
    kind = d["kind"]
    if not isinstance(kind, str) or kind not in _REGISTRY:
        raise LaminaError(
            f"unknown tokenizer kind {kind!r}; known kinds: " + ", ".join(known_tokenizer_kinds())
        )
    return _REGISTRY[kind](d)


def tokenizer_hash(tok: Tokenizer) -> str:
    """sha256 of the tokenizer's canonical JSON: what ties derived files to the ids they hold."""
    import hashlib

    text = json.dumps(tok.to_dict(), ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


def save_tokenizer(tok: Tokenizer, path: str | os.PathLike[str]) -> None:
    """Write ``tok.to_dict()`` as UTF-8 JSON to ``path`` atomically (temp file, fsync, replace)."""
    d = tok.to_dict()
    if not isinstance(d, dict) or "kind" not in d:
        raise LaminaError(
            f"{type(tok).__name__}.to_dict() must return a dict with a 'kind' field to be saved"
        )
    try:
        text = json.dumps(d, ensure_ascii=False, indent=1, sort_keys=True) + "\n"
    except (TypeError, ValueError) as e:
        raise LaminaError(f"{type(tok).__name__}.to_dict() is not JSON-serialisable: {e}") from e
    data = text.encode("utf-8", errors="surrogatepass")
    atomic_write(path, lambda f: f.write(data))


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """Read a tokenizer written by ``save_tokenizer``."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise LaminaError(f"no such tokenizer file: {p}") from None
    except IsADirectoryError:
        raise LaminaError(f"tokenizer path is a folder, not a file: {p}") from None
    try:
        d = loads_json(raw.decode("utf-8", errors="surrogatepass"), f"tokenizer file {p}")
    except UnicodeDecodeError as e:
        raise LaminaError(f"tokenizer file {p} is not UTF-8 (byte offset {e.start})") from e
    except json.JSONDecodeError as e:
        raise LaminaError(
            f"tokenizer file {p} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        ) from e
    try:
        return tokenizer_from_dict(d)
    except LaminaError as e:
        raise LaminaError(f"tokenizer file {p}: {e}") from e


def check_token_ids(ids: Iterable[int], vocab_size: int) -> list[int]:
    """Ids (any iterable of ints, numpy array, 1-D tensor) -> list of ints in [0, vocab_size)."""
    if isinstance(ids, (str, bytes)):
        raise LaminaError(f"decode takes integer ids, got {type(ids).__name__}")
    tolist = getattr(ids, "tolist", None)
    seq = tolist() if callable(tolist) else ids
    if isinstance(seq, (int, float)):
        seq = [seq]
    out = []
    for position, value in enumerate(seq):
        try:
            i = operator.index(value)
        except TypeError:
            raise LaminaError(
                f"token id at position {position} must be an integer, got {value!r}"
            ) from None
        if not 0 <= i < vocab_size:
            raise LaminaError(
                f"token id {i} at position {position} is outside the vocabulary [0, {vocab_size})"
            )
        out.append(i)
    return out


class CharTokenizer:
    """One id per character (Unicode code point); id ``i`` is ``chars[i]``.

    ``unk``, if set, is one of ``chars``; encoding maps characters outside the vocabulary to
    its id instead of raising. ``special_tokens`` is ``{"unk": id}`` then, else ``{}``.
    """

    kind = "char"

    def __init__(self, chars: Sequence[str], unk: str | None = None) -> None:
        if isinstance(chars, bytes):
            raise LaminaError("chars must be a sequence of single-character strings, got bytes")
        chars = tuple(chars)
        if not chars:
            raise LaminaError("chars must not be empty: a tokenizer needs at least one character")
        index: dict[str, int] = {}
        for i, c in enumerate(chars):
            if not isinstance(c, str) or len(c) != 1:
                raise LaminaError(f"chars[{i}] must be a single-character string, got {c!r}")
            if c in index:
                raise LaminaError(f"chars has {c!r} twice (positions {index[c]} and {i})")
            index[c] = i
        if unk is not None:
            if not isinstance(unk, str) or len(unk) != 1:
                raise LaminaError(f"unk must be a single-character string or None, got {unk!r}")
            if unk not in index:
                raise LaminaError(f"unk {unk!r} is not one of the tokenizer's characters")
        self._chars = chars
        self._index = index
        self._unk = unk
        self._unk_id = None if unk is None else index[unk]
        # Lookup table indexed by code point: id, or -1 for characters outside the vocabulary.
        # The last slot stays -1 and catches every code point above the largest in the vocab.
        cps = np.fromiter((ord(c) for c in chars), dtype=np.int64, count=len(chars))
        self._lut = np.full(int(cps.max()) + 2, -1, dtype=np.int64)
        self._lut[cps] = np.arange(len(chars), dtype=np.int64)

    @classmethod
    def from_text(cls, text: str, unk: str | None = None) -> CharTokenizer:
        """Vocabulary ``sorted(set(text))`` (plus ``unk`` if given, keeping the sort)."""
        if not isinstance(text, str):
            raise LaminaError(f"text must be a str, got {type(text).__name__}")
        chars = set(text)
        if unk is not None:
            if not isinstance(unk, str) or len(unk) != 1:
                raise LaminaError(f"unk must be a single-character string or None, got {unk!r}")
            chars.add(unk)
        if not chars:
            raise LaminaError("cannot build a character tokenizer from empty text")
        return cls(sorted(chars), unk=unk)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CharTokenizer:
        """Inverse of ``to_dict``."""
        if not isinstance(d, dict):
            raise LaminaError(f"a char tokenizer description must be a dict, got {d!r}")
        if d.get("kind", cls.kind) != cls.kind:
            raise LaminaError(f"expected kind {cls.kind!r}, got {d.get('kind')!r}")
        extra = sorted(set(d) - {"kind", "chars", "unk"})
        if extra:
            raise LaminaError(f"char tokenizer description has unexpected fields: {extra}")
        if "chars" not in d:
            raise LaminaError("char tokenizer description has no 'chars' field")
        chars = d["chars"]
        if not isinstance(chars, list):
            raise LaminaError(f"'chars' must be a list of characters, got {type(chars).__name__}")
        return cls(chars, unk=d.get("unk"))

    @property
    def vocab_size(self) -> int:
        """Number of characters."""
        return len(self._chars)

    @property
    def chars(self) -> tuple[str, ...]:
        """The vocabulary; ``chars[i]`` has id ``i``."""
        return self._chars

    @property
    def unk(self) -> str | None:
        """The fallback character for unknown input, or None (unknown input raises)."""
        return self._unk

    @property
    def special_tokens(self) -> dict[str, int]:
        """``{"unk": id}`` if an unk character is set, else ``{}``."""
        return {} if self._unk_id is None else {"unk": self._unk_id}

    def encode_array(self, text: str) -> np.ndarray:
        """Text -> int64 ids of shape ``(len(text),)``, vectorised with numpy."""
        if not isinstance(text, str):
            raise LaminaError(f"text must be a str, got {type(text).__name__}")
        # UTF-32 gives exactly one 4-byte unit per code point, so index i is text[i].
        cps = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype="<u4")
        ids = self._lut[np.minimum(cps, len(self._lut) - 1)]
        known = ids >= 0
        if not known.all():
            if self._unk_id is None:
                where = int(np.flatnonzero(~known)[0])
                raise LaminaError(
                    f"character {text[where]!r} at position {where} is not in the tokenizer's "
                    f"vocabulary ({self.vocab_size} characters); build the tokenizer from this "
                    "text or set unk"
                )
            ids[~known] = self._unk_id
        return ids

    def encode(self, text: str) -> list[int]:
        """Text -> list of ids, one per character."""
        return self.encode_array(text).tolist()

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text. Accepts any iterable of ints, numpy arrays and 1-D torch tensors."""
        chars = self._chars
        return "".join(chars[i] for i in check_token_ids(ids, len(chars)))

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "char", "chars": [...], "unk": str | None}``."""
        return {"kind": self.kind, "chars": list(self._chars), "unk": self._unk}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CharTokenizer):
            return NotImplemented
        return self._chars == other._chars and self._unk == other._unk

    def __hash__(self) -> int:
        return hash((self.kind, self._chars, self._unk))

    def __repr__(self) -> str:
        shown = "".join(self._chars[:20])
        more = "..." if len(self._chars) > 20 else ""
        return (
            f"CharTokenizer(vocab_size={self.vocab_size}, chars={shown!r}{more}, unk={self._unk!r})"
        )


register_tokenizer(CharTokenizer.kind, CharTokenizer.from_dict)

"""Layer 2, subword tokenizers: raw bytes, byte-level BPE learned from your corpus, GPT-2's BPE.

    ByteTokenizer()                   kind "byte": one id per UTF-8 byte, vocab 256
    BPETokenizer.train(text, n)       kind "bpe":  byte-level BPE with at most n ids, trained by
                                      the `tokenizers` library in bounded chunks (bpe_trainer.py);
                                      id 0 is "<|endoftext|>"
    GPT2Tokenizer.from_dir(dir)       kind "gpt2": OpenAI's GPT-2 BPE (50,257 ids, "<|endoftext|>"
                                      = 50256) run by `tiktoken`, built offline from encoder.json +
                                      vocab.bpe in `dir`, both checked against their sha256

In and out, as every lamina tokenizer: ``encode(str) -> list[int]``, ``encode_array(str) ->
np.ndarray`` (int64, shape ``(n_tokens,)``), ``decode(ids) -> str``, ``to_dict()`` (registered
with ``register_tokenizer``, so ``load_tokenizer`` rebuilds each kind from ``tokenizer.json``).

Every kind works on UTF-8 bytes, so ``decode(encode(s)) == s`` for any Unicode string; strings
with lone surrogates (not Unicode scalar values, not encodable as UTF-8) are refused. Decoding
ids that cut a character in half gives U+FFFD there. Text spelling a special token
("<|endoftext|>") encodes to that token, as Hugging Face's tokenizers do.

Deliberately unaware of models and tensors; never downloads anything. The `tokenizers` and
`tiktoken` packages are imported when a tokenizer of their kind is built.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from lamina.errors import LaminaError
from lamina.tokenizers.kinds import check_token_ids, register_tokenizer

EOT = "<|endoftext|>"
GPT2_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
GPT2_VOCAB_SIZE = 50257


def _utf8(text: Any) -> bytes:
    if not isinstance(text, str):
        raise LaminaError(f"text must be a str, got {type(text).__name__}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise LaminaError(
            f"text has a lone surrogate {text[e.start]!r} at position {e.start}: not valid "
            "Unicode, so it has no UTF-8 bytes to tokenize"
        ) from None


def _part_type(part: Any) -> Any:
    """The "type" of one section of a tokenizers JSON (None if the section is not an object)."""
    return part.get("type") if isinstance(part, dict) else None


def _expect_kind(d: Any, kind: str, fields: set[str]) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise LaminaError(f"a {kind} tokenizer description must be a dict, got {d!r}")
    if d.get("kind", kind) != kind:
        raise LaminaError(f"expected kind {kind!r}, got {d.get('kind')!r}")
    extra = sorted(set(d) - fields - {"kind"})
    if extra:
        raise LaminaError(f"{kind} tokenizer description has unexpected fields: {extra}")
    missing = sorted(fields - set(d))
    if missing:
        raise LaminaError(f"{kind} tokenizer description lacks fields: {missing}")
    return d


class ByteTokenizer:
    """The UTF-8 bytes of the text, one id (0..255) each. No training, no special tokens."""

    kind = "byte"
    vocab_size = 256
    special_tokens: dict[str, int] = {}

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(_utf8(text), dtype=np.uint8).astype(np.int64)

    def encode(self, text: str) -> list[int]:
        return list(_utf8(text))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(check_token_ids(ids, 256)).decode("utf-8", errors="replace")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ByteTokenizer:
        _expect_kind(d, cls.kind, set())
        return cls()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash(self.kind)

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=256)"


class BPETokenizer:
    """Byte-level BPE from the `tokenizers` library; JSON form embeds its own tokenizer.json."""

    kind = "bpe"

    def __init__(self, hf_json: str) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        try:
            layout = json.loads(hf_json)
        except (TypeError, ValueError) as e:
            raise LaminaError(f"bpe tokenizer description is not a JSON string: {e}") from e
        if not isinstance(layout, dict):
            raise LaminaError("bpe tokenizer JSON must be an object")
        parts = [_part_type(layout.get(k)) for k in ("model", "pre_tokenizer", "decoder")]
        if parts != ["BPE", "ByteLevel", "ByteLevel"]:
            raise LaminaError(
                "bpe tokenizer must be byte-level BPE (model, pre-tokenizer, decoder = BPE, "
                f"ByteLevel, ByteLevel), got {', '.join(map(str, parts))}"
            )
        try:
            self._tok = HFTokenizer.from_str(hf_json)
        except Exception as e:  # tokenizers raises a bare Exception for malformed JSON
            raise LaminaError(f"bpe tokenizer JSON is not readable by `tokenizers`: {e}") from e
        self._json = hf_json
        self._size = self._tok.get_vocab_size(with_added_tokens=True)
        eot = self._tok.token_to_id(EOT)
        self._special = {} if eot is None else {EOT: eot}

    @classmethod
    def train(
        cls, text: str, vocab_size: int, progress: Callable[[str], None] | None = None
    ) -> BPETokenizer:
        """Learn merges from `text` until `vocab_size` ids (fewer if the text runs out of pairs).

        The text is fed in chunks of at most 4096 characters (see `bpe_trainer.py`: bounded
        memory and time, Ctrl-C works); `progress(line)` gets a few progress lines.
        """
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 257:
            raise LaminaError(
                f"bpe vocab size must be an integer >= 257 (256 bytes + {EOT}), got {vocab_size!r}"
            )
        _utf8(text)
        if not text:
            raise LaminaError("cannot train a BPE tokenizer on empty text")
        from lamina.tokenizers.bpe_trainer import train_bpe_json

        return cls(train_bpe_json(text, vocab_size, [EOT], progress))

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special)

    @property
    def hf_json(self) -> str:
        """The Hugging Face `tokenizers` JSON (what a Hugging Face tokenizer.json holds)."""
        return self._json

    def encode(self, text: str) -> list[int]:
        _utf8(text)
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(check_token_ids(ids, self._size), skip_special_tokens=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "tokenizer": self._json}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BPETokenizer:
        _expect_kind(d, cls.kind, {"tokenizer"})
        if not isinstance(d["tokenizer"], str):
            raise LaminaError("bpe tokenizer description: 'tokenizer' must be a JSON string")
        return cls(d["tokenizer"])

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self._size})"


def _gpt2_byte_chars() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte (as in encoder.json/vocab.bpe) -> byte."""
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


def gpt2_ranks(merges: str) -> dict[bytes, int]:
    """vocab.bpe text -> tiktoken's mergeable ranks: 256 bytes in GPT-2's order, then merges."""
    char_byte = _gpt2_byte_chars()
    ranks = {bytes([b]): i for i, b in enumerate(char_byte.values())}
    lines = merges.split("\n")
    if not lines[0].startswith("#version"):
        raise LaminaError("vocab.bpe must start with a '#version' line")
    for n, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        pair = line.split(" ")
        try:
            token = b"".join(bytes(char_byte[c] for c in part) for part in pair)
        except KeyError:
            raise LaminaError(f"vocab.bpe line {n} has a character outside GPT-2's bytes") from None
        if len(pair) != 2 or token in ranks:
            raise LaminaError(f"vocab.bpe line {n} is not a new merge of two tokens: {line!r}")
        ranks[token] = len(ranks)
    return ranks


class GPT2Tokenizer:
    """OpenAI's GPT-2 BPE through tiktoken; JSON form embeds vocab.bpe (checked by sha256)."""

    kind = "gpt2"
    vocab_size = GPT2_VOCAB_SIZE

    def __init__(self, merges: str) -> None:
        digest = hashlib.sha256(merges.encode("utf-8")).hexdigest()
        if digest != GPT2_SHA256["vocab.bpe"]:
            raise LaminaError(
                f"GPT-2 merges have sha256 {digest}, expected {GPT2_SHA256['vocab.bpe']}"
            )
        import tiktoken

        self._merges = merges
        self._ranks = gpt2_ranks(merges)
        self._enc = tiktoken.Encoding(
            name="gpt2",
            pat_str=GPT2_PATTERN,
            mergeable_ranks=self._ranks,
            special_tokens={EOT: GPT2_VOCAB_SIZE - 1},
            explicit_n_vocab=GPT2_VOCAB_SIZE,
        )

    @classmethod
    def from_dir(cls, directory: str | Path) -> GPT2Tokenizer:
        """Build from encoder.json + vocab.bpe in `directory` (sha256 and consistency checked)."""
        d = Path(directory)
        raw = {}
        for name, want in GPT2_SHA256.items():
            p = d / name
            if not p.is_file():
                raise LaminaError(f"GPT-2 tokenizer folder {d} has no {name}")
            raw[name] = p.read_bytes()
            got = hashlib.sha256(raw[name]).hexdigest()
            if got != want:
                raise LaminaError(f"{p} has sha256 {got}, expected GPT-2's {want}")
        tok = cls(raw["vocab.bpe"].decode("utf-8"))
        if json.loads(raw["encoder.json"]) != tok.encoder():
            raise LaminaError(f"{d / 'encoder.json'} does not match the merges in vocab.bpe")
        return tok

    def encoder(self) -> dict[str, int]:
        """The encoder.json (Hugging Face: vocab.json) mapping these merges imply."""
        byte_char = {b: c for c, b in _gpt2_byte_chars().items()}
        enc = {"".join(byte_char[b] for b in tok): i for tok, i in self._ranks.items()}
        enc[EOT] = GPT2_VOCAB_SIZE - 1
        return enc

    @property
    def merges(self) -> str:
        """vocab.bpe as text (Hugging Face: merges.txt)."""
        return self._merges

    @property
    def special_tokens(self) -> dict[str, int]:
        return {EOT: GPT2_VOCAB_SIZE - 1}

    def encode(self, text: str) -> list[int]:
        _utf8(text)
        return self._enc.encode(text, allowed_special="all")

    def encode_array(self, text: str) -> np.ndarray:
        _utf8(text)
        return self._enc.encode_to_numpy(text, allowed_special="all").astype(np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        data = self._enc.decode_bytes(check_token_ids(ids, GPT2_VOCAB_SIZE))
        return data.decode("utf-8", errors="replace")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "merges": self._merges}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPT2Tokenizer:
        _expect_kind(d, cls.kind, {"merges"})
        if not isinstance(d["merges"], str):
            raise LaminaError("gpt2 tokenizer description: 'merges' must be a string")
        return cls(d["merges"])

    def __repr__(self) -> str:
        return f"GPT2Tokenizer(vocab_size={GPT2_VOCAB_SIZE})"


register_tokenizer(ByteTokenizer.kind, ByteTokenizer.from_dict)
register_tokenizer(BPETokenizer.kind, BPETokenizer.from_dict)
register_tokenizer(GPT2Tokenizer.kind, GPT2Tokenizer.from_dict)

"""Text corpora of any size -> token shards (see `shards`), streamed, never held in memory.

    fit_tokenizer(spec, files, ...)       char: every character of the corpus (one streaming
                                          pass); bpe:N: trained on a sample of pieces of at
                                          most `fit_bytes`; byte / gpt2:DIR: as specified; a
                                          tokenizer.json or a model folder: its tokenizer
    separator(tokenizer) -> [ids]         what goes between documents
    prepare_corpus(data, tokenizer, out, ...) -> summary dict (what index.json holds, + seconds)

Documents come from `sources.read_pieces`. Encoding goes in batches of pieces: byte-level BPE
through `tokenizers`' batch encoder and GPT-2 through tiktoken's (both use every core),
characters through numpy. Documents are joined with the tokenizer's end-of-text token if it has
one, else "\n" if it can encode it. The validation split is the last `val_fraction` of the
tokens (by="tail", as `lamina train` splits raw text) or that fraction of the documents
(by="documents": document i is held out when (i+1)*0.618... mod 1 falls below the fraction,
spread evenly and deterministic).

Everything is written into a temporary folder beside `out` and swapped into place after the
index (`lamina.files.build_folder`: `force` replaces only a folder lamina wrote, and `out` may
not hold, be or sit inside the corpus); any failure (bad input, a full disk, Ctrl-C) removes it,
so `out` is either complete or as it was. Memory: one batch of pieces (~16 MiB of text), their ids, and one int64 per document.

Deliberately unaware of models, training and progress bars (`progress` is a callback).
"""

from __future__ import annotations

import errno
import math
import os
import time
import zlib
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lamina.data.corpus import token_dtype
from lamina.data.shards import FORMAT, INDEX_NAME, VERSION, ShardWriter
from lamina.data.sources import Progress, corpus_files, read_pieces, total_bytes
from lamina.data.spec import build_tokenizer, saved_tokenizer
from lamina.errors import LaminaError
from lamina.files import build_folder, check_output_folder, write_json
from lamina.tokenizers.kinds import (
    CharTokenizer,
    Tokenizer,
    save_tokenizer,
    tokenizer_hash,
)
from lamina.tokenizers.subword import EOT, BPETokenizer, GPT2Tokenizer

BATCH_CHARS = 16 << 20
SHARD_TOKENS = 1 << 28
FIT_SEGMENT = 1 << 16
GOLDEN = (math.sqrt(5) - 1) / 2


def _char_set(files: list[Path], skip_bad: bool, progress: Progress | None) -> set[str]:
    counts = np.zeros(128, dtype=np.int64)
    chars: set[str] = set()
    for piece, _ in read_pieces(files, skip_bad, None, progress):
        if piece.isascii():
            counts += np.bincount(np.frombuffer(piece.encode("ascii"), np.uint8), minlength=128)
        else:
            chars.update(piece)
    return chars | {chr(c) for c in np.flatnonzero(counts)}


def fit_tokenizer(
    spec: str, files: list[Path], *, fit_bytes: int = 32 << 20, skip_bad: bool = False,
    progress: Progress | None = None,
) -> Tokenizer:  # fmt: skip
    """The tokenizer `spec` names, fitted to the corpus where it is learned from it.

    `spec` may also be a tokenizer.json file or a model/run folder holding one.
    """
    saved = saved_tokenizer(spec)
    if saved is not None:
        return saved
    if spec == "char":
        chars = _char_set(files, skip_bad, progress) | {"\n"}
        return CharTokenizer(sorted(chars))
    kind, _, arg = spec.partition(":")
    if kind != "bpe":
        return build_tokenizer(spec)
    if not arg.isdigit() or int(arg) < 257:
        build_tokenizer(spec, "x")  # the spec's own error message
    keep = min(1.0, fit_bytes / max(total_bytes(files), 1))
    rng = np.random.default_rng(0)
    taken = [0]

    def sample() -> Iterator[str]:  # streamed to the trainer: nothing is collected
        for piece, _ in read_pieces(files, skip_bad, None, progress):
            if taken[0] < fit_bytes and rng.random() < keep:
                taken[0] += len(piece)
                for i in range(0, len(piece), FIT_SEGMENT):
                    yield piece[i : i + FIT_SEGMENT]

    tok = _train_bpe(sample(), int(arg))
    if taken[0] == 0:
        raise LaminaError("the corpus is empty: nothing to fit a tokenizer to")
    return tok


def _train_bpe(texts: Iterator[str], vocab_size: int) -> BPETokenizer:
    """`BPETokenizer.train`'s settings, fed short texts one by one: the `tokenizers` trainer
    holds a single long string's pre-tokenized words all at once (780 MB for 8 MB of text),
    but only counts when fed pieces (40 MB)."""
    from lamina.tokenizers.bpe_trainer import bpe_setup

    tok, trainer = bpe_setup(vocab_size, [EOT])
    tok.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(tok.to_str())


def separator(tok: Tokenizer) -> list[int]:
    """What goes between documents: end-of-text if the tokenizer has it, else "\\n" if known."""
    if EOT in tok.special_tokens:
        return [tok.special_tokens[EOT]]
    try:
        return list(tok.encode("\n"))
    except LaminaError:
        return []


def encoder_for(tok: Tokenizer) -> Callable[[list[str]], list[np.ndarray]]:
    """Encode a batch of texts with every core where the tokenizer's library allows it."""
    if isinstance(tok, BPETokenizer):
        from tokenizers import Tokenizer as HFTokenizer

        hf = HFTokenizer.from_str(tok.hf_json)
        return lambda texts: [
            np.asarray(e.ids, dtype=np.int64)
            for e in hf.encode_batch_fast(texts, add_special_tokens=False)
        ]
    enc = getattr(tok, "_enc", None) if isinstance(tok, GPT2Tokenizer) else None
    if enc is not None:
        return lambda texts: [
            np.asarray(ids, dtype=np.int64)
            for ids in enc.encode_batch(texts, allowed_special="all")
        ]
    if isinstance(tok, CharTokenizer):
        return _char_encoder(tok)
    return lambda texts: [np.asarray(tok.encode_array(t)) for t in texts]


def _char_encoder(tok: CharTokenizer) -> Callable[[list[str]], list[np.ndarray]]:
    """ASCII pieces through a 128-entry table on their bytes (no UTF-32 copy); others as usual."""
    table = np.full(128, -1, dtype=np.int32)
    for i, c in enumerate(tok.chars):
        if ord(c) < 128:
            table[ord(c)] = i
    if tok.unk is not None:
        table[table < 0] = tok.special_tokens["unk"]

    def one(text: str) -> np.ndarray:
        if text.isascii():
            ids = table[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
            if ids.size == 0 or ids.min() >= 0:
                return ids
        return tok.encode_array(text)  # names the first character it cannot encode

    return lambda texts: [one(t) for t in texts]


def prepare_corpus(
    data: str | os.PathLike[str], tokenizer: str, out: str | os.PathLike[str], *,
    val_fraction: float = 0.1, val_by: str = "tail", shard_tokens: int = SHARD_TOKENS,
    skip_bad_lines: bool = False, fit_bytes: int = 32 << 20, force: bool = False,
    progress: Callable[[str, int], Progress | None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Tokenize `data` into shards in `out`; returns the counts and timings.

    progress(stage, total_bytes) -> a callback for that stage ("fit", "encode"), or None.
    """
    if val_by not in ("tail", "documents"):
        raise LaminaError(f"val_by must be 'tail' or 'documents', got {val_by!r}")
    if not 0.0 <= val_fraction < 1.0:
        raise LaminaError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if shard_tokens < 1:
        raise LaminaError(f"shard_tokens must be at least 1, got {shard_tokens}")
    files, out = corpus_files(data), Path(out)
    size = total_bytes(files)
    bar = progress or (lambda stage, total: None)
    started = time.perf_counter()
    inputs = [("DATA", data), ("--tokenizer", tokenizer)]
    check_output_folder(out, force=force, inputs=inputs)
    summary: dict[str, Any] = {}

    def build(tmp: Path) -> None:
        tok = fit_tokenizer(tokenizer, files, fit_bytes=fit_bytes, skip_bad=skip_bad_lines,
                            progress=bar("fit", size) if tokenizer in ("char",) or
                            tokenizer.startswith("bpe:") else None)  # fmt: skip
        fitted = time.perf_counter()
        summary.update(_encode_all(tok, files, tmp, val_fraction, val_by, shard_tokens,
                                   skip_bad_lines, bar("encode", size)))  # fmt: skip
        encoded = time.perf_counter()
        summary.update(
            format=FORMAT, version=VERSION, spec=tokenizer, vocab_size=int(tok.vocab_size),
            tokenizer_sha256=tokenizer_hash(tok),
            source=str(Path(data).resolve()), files=len(files), input_bytes=size,
            fit_seconds=round(fitted - started, 3), encode_seconds=round(encoded - fitted, 3),
        )  # fmt: skip
        save_tokenizer(tok, tmp / "tokenizer.json")
        write_json(tmp / INDEX_NAME, summary)  # last: its presence marks a complete folder

    try:
        build_folder(out, build, kind="prepared", force=force, inputs=inputs)
    except OSError as e:
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        why = "the disk is full" if full else (e.strerror or str(e))
        raise LaminaError(
            f"writing {out} failed: {why}; no index written, partial shards removed"
        ) from e
    summary["seconds"] = round(time.perf_counter() - started, 3)
    return summary


def _encode_all(
    tok: Tokenizer, files: list[Path], tmp: Path, val_fraction: float, val_by: str,
    shard_tokens: int, skip_bad: bool, progress: Progress | None,
) -> dict[str, Any]:  # fmt: skip
    dtype = token_dtype(int(tok.vocab_size))
    sep = np.asarray(separator(tok), dtype=np.int64)
    writers = {"main": ShardWriter(tmp, "main", dtype, shard_tokens)}
    if val_by == "documents":
        writers["val"] = ShardWriter(tmp, "val", dtype, shard_tokens)
    starts = {name: array("q") for name in writers}
    encode, bad = encoder_for(tok), [0]
    counts = {"documents": 0, "characters": 0}
    crc, doc, new_doc = 0, 0, True
    batch: list[tuple[str, bool, int, int]] = []  # piece, ends a document, document, offset

    cur: dict[str, Any] = {"doc": -1, "writer": None}

    def flush() -> None:
        for (_, _, d, _), ids in zip(batch, encode([b[0] for b in batch]), strict=True):
            w = writers["val" if "val" in writers and _is_val(d, val_fraction) else "main"]
            if d != cur["doc"]:
                if cur["writer"] is not None and len(sep):
                    cur["writer"].write(sep)
                starts[w.stream].append(w.total)
                cur["doc"], cur["writer"] = d, w
            w.write(ids)
        batch.clear()

    size = 0
    for piece, end in read_pieces(files, skip_bad, bad, progress):
        if new_doc:
            counts["documents"] += 1
        offset = counts["characters"]
        counts["characters"] += len(piece)
        crc = zlib.crc32(piece.encode("utf-8", errors="surrogatepass"), crc)
        batch.append((piece, end, doc, offset))
        size += len(piece)
        new_doc = end
        doc += int(end)
        if size >= BATCH_CHARS:
            _checked_flush(flush, batch, tok)
            size = 0
    _checked_flush(flush, batch, tok)
    for w in writers.values():
        w.close()
    if counts["documents"] == 0 or counts["characters"] == 0:
        raise LaminaError("the corpus is empty: no text in any document")
    main = writers["main"].total
    if val_by == "tail":
        cut = int(main * (1 - val_fraction))
        splits = {"train": {"stream": "main", "start": 0, "stop": cut},
                  "val": {"stream": "main", "start": cut, "stop": main}}  # fmt: skip
        docs = np.frombuffer(starts["main"], dtype=np.int64) if starts["main"] else np.zeros(0)
        parts = {"train": docs[docs < cut], "val": docs[docs >= cut] - cut}
    else:
        if val_fraction > 0 and writers["val"].total == 0:
            raise LaminaError(
                f"--val-by documents held out no document: {counts['documents']} document(s) "
                f"at --val-fraction {val_fraction} leave the validation split empty; use "
                "--val-by tail, a larger --val-fraction or more documents"
            )
        if writers["main"].total == 0:
            raise LaminaError(
                f"--val-by documents held out every document ({counts['documents']}); the "
                "training split is empty: use a smaller --val-fraction or more documents"
            )
        splits = {"train": {"stream": "main", "start": 0, "stop": main},
                  "val": {"stream": "val", "start": 0, "stop": writers["val"].total}}  # fmt: skip
        parts = {n: np.frombuffer(starts[k], dtype=np.int64) if starts[k] else np.zeros(0)
                 for n, k in (("train", "main"), ("val", "val"))}  # fmt: skip
    for name, arr in parts.items():
        np.save(tmp / f"{name}.docs.npy", arr.astype(np.int64), allow_pickle=False)
        splits[name]["documents"] = len(arr)
        splits[name]["doc_starts"] = f"{name}.docs.npy"
    shards = [s for w in writers.values() for s in w.shards]
    return {
        "dtype": dtype.name, "separator": sep.tolist(), "shards": shards, "splits": splits,
        "validation": {"by": val_by, "fraction": val_fraction},
        "documents": counts["documents"], "characters": counts["characters"],
        "tokens": sum(w.total for w in writers.values()), "bad_lines_skipped": bad[0],
        "fingerprint": f"{counts['characters']}:{crc:08x}",
    }  # fmt: skip


def _is_val(doc: int, fraction: float) -> bool:
    return ((doc + 1) * GOLDEN) % 1.0 < fraction


def _checked_flush(flush: Callable[[], None], batch: list, tok: Tokenizer) -> None:
    """Encode and write the batch; a character the char tokenizer lacks is named with its
    position in the corpus (characters counted over all documents, in order)."""
    if not batch:
        return
    try:
        flush()
    except LaminaError as e:
        if not isinstance(tok, CharTokenizer):
            raise
        known = set(tok.chars)
        for piece, _, d, offset in batch:
            i = next((i for i, c in enumerate(piece) if c not in known), None)
            if i is not None:
                raise LaminaError(
                    f"character {piece[i]!r} at position {offset + i} of the corpus (document "
                    f"{d + 1}) is not in the tokenizer's vocabulary ({tok.vocab_size} "
                    "characters); prepare with a tokenizer that has it, or one with unk"
                ) from e
        raise

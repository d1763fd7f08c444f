"""Labelled texts for classification: read them, split them, encode them, pad them.

    read_labelled(path, text_column="text", label_column="label") -> LabelledTexts
        .csv / .tsv (.tab): a header row naming the columns; quoted fields may hold newlines
        .jsonl: one {"text": ..., "label": ...} object per line (blank lines skipped)
        a folder: one subfolder per label holding .txt files, one text per file (whatever
        else is there, and an empty label folder, is named in one warning)
    label_names(labels) -> sorted distinct labels (the id of a label is its index)
    stratified_split(labels, val_fraction, seed) -> (train indices, val indices)
    encode_texts(tokenizer, texts, max_len) -> (list of int64 arrays, number truncated)
    pad_batch(seqs) -> (ids (B, T) int64, padding_mask (B, T) bool, True at pads)

Files are read as UTF-8 (a leading byte-order mark is dropped); labels are strings (a JSON
number becomes its text). Every problem is a LaminaError naming the file and line: a missing
column (and the columns the file has), an empty label, a row that is not UTF-8, a JSONL line
that is not JSON, fewer than two distinct labels.

Ids for the encoder (CLASSIFIER_IDS): 0 is padding, 1 a classification token put first in
every sequence, and a tokenizer id i becomes i + 2; so the model's vocabulary is the
tokenizer's + 2 and `max_len` counts the classification token. A text longer than max_len - 1
tokens keeps its first max_len - 1.

Deliberately unaware of models and training.
"""

from __future__ import annotations

import csv
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lamina.errors import LaminaError, LaminaWarning
from lamina.files import json_lines
from lamina.tokenizers.kinds import Tokenizer

PAD, CLS, OFFSET = 0, 1, 2
CLASSIFIER_IDS = {"pad_id": PAD, "cls_id": CLS, "offset": OFFSET}
FORMATS = ".csv, .tsv, .jsonl or a folder with one subfolder per label"


@dataclass
class LabelledTexts:
    texts: list[str]
    labels: list[str]
    source: str  # the file or folder (or the built-in task's name)

    def __len__(self) -> int:
        return len(self.texts)


def _decode(raw: bytes, where: str) -> str:
    """Strict UTF-8; an invalid byte is an error naming the line it is on."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise LaminaError(
            f"{where} line {line}: not valid UTF-8 (byte 0x{raw[exc.start]:02x}); "
            "save the file as UTF-8"
        ) from None
    return text[1:] if text.startswith("\ufeff") else text


def _label(value: object, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise LaminaError(f"{where}: the label must be a string, got {value!r}")
    label = str(value).strip()
    if not label:
        raise LaminaError(f"{where}: empty label")
    return label


def _read_table(path: Path, text_col: str, label_col: str) -> LabelledTexts:
    delimiter = "," if path.suffix.lower() == ".csv" else "\t"
    text = _decode(path.read_bytes(), str(path))
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        raise LaminaError(f"{path} is empty; it needs a header row naming its columns") from None
    except csv.Error as exc:
        raise LaminaError(f"{path} line 1: {exc}") from None
    header = [h.strip() for h in header]
    for flag, col in (("--text-column", text_col), ("--label-column", label_col)):
        if col not in header:
            raise LaminaError(
                f"{path} has no column {col!r} (its columns: {', '.join(map(repr, header))}); "
                f"name the column with {flag}"
            )
    ti, li = header.index(text_col), header.index(label_col)
    texts, labels = [], []
    start = reader.line_num + 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise LaminaError(f"{path} line {start}: {exc}") from None
        where = f"{path} line {start}"
        start = reader.line_num + 1
        if not row:
            continue
        if len(row) <= max(ti, li):
            raise LaminaError(f"{where}: {len(row)} fields, the header has {len(header)}")
        texts.append(row[ti])
        labels.append(_label(row[li], where))
    return LabelledTexts(texts, labels, str(path))


def _read_jsonl(path: Path, text_col: str, label_col: str) -> LabelledTexts:
    texts, labels = [], []
    for where, obj in json_lines(_decode(path.read_bytes(), str(path)), str(path)):
        if not isinstance(obj, dict):
            raise LaminaError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        for col in (text_col, label_col):
            if col not in obj:
                keys = ", ".join(map(repr, obj)) or "none"
                raise LaminaError(f"{where}: no {col!r} field (its fields: {keys})")
        if not isinstance(obj[text_col], str):
            raise LaminaError(f"{where}: {text_col!r} must be a string")
        texts.append(obj[text_col])
        labels.append(_label(obj[label_col], where))
    return LabelledTexts(texts, labels, str(path))


def _read_folder(path: Path) -> LabelledTexts:
    """One subfolder per label, one .txt file (any case) per text directly inside it. Left out,
    and named in one warning: files beside the label folders, folders inside them, files not
    named .txt, hidden entries, and label folders with no text (not a label then)."""
    texts, labels, skipped = [], [], []
    for sub in sorted(path.iterdir(), key=lambda p: p.name):
        if sub.name.startswith("."):
            skipped.append(f"{sub.name} (hidden)")
        elif not sub.is_dir():
            skipped.append(f"{sub.name} (a file outside the label folders)")
        else:
            found = 0
            for f in sorted(sub.iterdir(), key=lambda p: p.name):
                rel = f"{sub.name}/{f.name}"
                if f.name.startswith("."):
                    skipped.append(f"{rel} (hidden)")
                elif f.is_dir():
                    skipped.append(f"{rel} (a folder inside a label folder)")
                elif not f.name.lower().endswith(".txt") or not f.is_file():
                    skipped.append(f"{rel} (not a .txt file)")
                else:
                    texts.append(_decode(f.read_bytes(), str(f)))
                    labels.append(_label(sub.name, str(sub)))
                    found += 1
            if not found:
                skipped.append(f"{sub.name}/ (no .txt texts: not a label)")
    if not texts:
        raise LaminaError(
            f"{path} has no subfolders holding .txt files; a folder of labelled texts has one "
            "subfolder per label (its name) with one .txt file per text"
        )
    if skipped:
        shown = "; ".join(skipped[:6]) + (f"; {len(skipped) - 6} more" if len(skipped) > 6 else "")
        warnings.warn(f"labelled folder {path}: skipped {shown}", LaminaWarning, stacklevel=3)
    return LabelledTexts(texts, labels, str(path))


def read_labelled(
    path: str | os.PathLike[str], text_column: str = "text", label_column: str = "label"
) -> LabelledTexts:
    """Texts and string labels from a CSV/TSV, JSONL or folder (see the module docstring)."""
    p = Path(path)
    if p.is_dir():
        data = _read_folder(p)
    elif not p.exists():
        raise LaminaError(f"no such file or folder: {p}")
    elif p.suffix.lower() in (".csv", ".tsv", ".tab"):
        data = _read_table(p, text_column, label_column)
    elif p.suffix.lower() in (".jsonl", ".ndjson"):
        data = _read_jsonl(p, text_column, label_column)
    else:
        raise LaminaError(f"{p}: unknown format {p.suffix or '(no extension)'!r}; use {FORMATS}")
    if not data.texts:
        raise LaminaError(f"{p} holds no labelled texts")
    return data


def label_names(labels: list[str], source: str = "the data") -> list[str]:
    """The distinct labels, sorted: the stable order in which labels get their ids."""
    names = sorted(set(labels))
    if len(names) < 2:
        only = f" ({names[0]!r})" if names else ""
        raise LaminaError(
            f"{source} has a single label{only}; a classifier needs at least two classes"
        )
    return names


def stratified_split(
    labels: list[str], val_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, val): round(n * val_fraction) of each label's n items held out, seeded.

    A label with a single item stays in training. Both index arrays are sorted.
    """
    if not 0.0 < val_fraction < 1.0:
        raise LaminaError(f"--val-fraction must be between 0 and 1, got {val_fraction!r}")
    rng = np.random.default_rng(seed)
    by_label: dict[str, list[int]] = {}
    for i, lab in enumerate(labels):
        by_label.setdefault(lab, []).append(i)
    val: list[int] = []
    for lab in sorted(by_label):
        idx = np.array(by_label[lab])
        k = int(round(len(idx) * val_fraction)) if len(idx) > 1 else 0
        k = min(max(k, 1 if len(idx) > 1 else 0), len(idx) - 1)
        val.extend(rng.permutation(idx)[:k].tolist())
    if not val:
        raise LaminaError(
            f"--val-fraction {val_fraction} holds out no texts; use a larger fraction or "
            "--val-data FILE"
        )
    val_idx = np.array(sorted(val), dtype=np.int64)
    train_idx = np.setdiff1d(np.arange(len(labels)), val_idx)
    return train_idx, val_idx


def encode_texts(
    tokenizer: Tokenizer, texts: list[str], max_len: int
) -> tuple[list[np.ndarray], int]:
    """[CLS] + tokenizer ids + OFFSET, cut to max_len; also how many texts were cut."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
        raise LaminaError(f"--max-len must be an integer >= 2, got {max_len!r}")
    enc = getattr(tokenizer, "encode_array", None) or tokenizer.encode
    out, cut = [], 0
    for t in texts:
        ids = np.asarray(enc(t), dtype=np.int64)
        if len(ids) > max_len - 1:
            ids, cut = ids[: max_len - 1], cut + 1
        out.append(np.concatenate([np.array([CLS], dtype=np.int64), ids + OFFSET]))
    return out, cut


def pad_batch(seqs: list[np.ndarray]) -> tuple[Tensor, Tensor]:
    """Right-pad to the longest sequence: ids (B, T) int64 and padding_mask (B, T), True at pads."""
    if not seqs:
        raise LaminaError("pad_batch needs at least one sequence")
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    ids = np.full((len(seqs), int(lengths.max())), PAD, dtype=np.int64)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = s
    mask = np.arange(ids.shape[1])[None, :] >= lengths[:, None]
    return torch.from_numpy(ids), torch.from_numpy(mask)

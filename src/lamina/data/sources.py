"""Documents of a corpus on disk, streamed as text pieces: never the whole corpus at once.

    corpus_files(path) -> [Path]         a file, or the files of a folder by THE FOLDER RULE
                                         (below); what it skips is named in one warning
    scan(folder) -> (files, skipped)     the folder rule itself: (entry, reason) for each skip
    total_bytes(files) -> int            their sizes on disk (compressed, for .gz)
    read_pieces(files, skip_bad, bad, progress) -> iterator of (text piece, ends a document?)

A .txt file is one document, read in pieces of about PIECE_CHARS characters, each cut after a
newline (a leading byte-order mark is dropped); each .jsonl line is one document, its "text"
field. A .gz file is decompressed on the fly; one cut short is an error naming it. A .jsonl
line that is not JSON or has no "text" string is an error naming file and line, or, with
`skip_bad`, skipped and counted in `bad[0]`. `progress(n)` hears of every n bytes read from
disk.

The folder rule, the one every verb follows (`lamina train --data DIR`, `lamina prepare DIR`,
`lamina eval --data DIR` read the same files): every file in the folder's tree whose name ends
in .txt, .jsonl, .txt.gz or .jsonl.gz, in any case (`a.txt`, `B.TXT`, `sub/c.jsonl.gz`),
sorted by path relative to the folder. Left out, and named in one `LaminaWarning`: hidden
files and folders (a name starting with "."), editor lock files (`.#notes.txt`), broken
symlinks, symlinks to folders (not followed: no loops), special files and every other file
(counted, a few named). A symlink to a file counts as that file.

Deliberately unaware of tokenizers, tokens and shards.
"""

from __future__ import annotations

import codecs
import gzip
import os
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from lamina.errors import LaminaError, LaminaWarning
from lamina.files import loads_json

SUFFIXES = (".txt", ".jsonl", ".txt.gz", ".jsonl.gz")
PIECE_CHARS = 1 << 20
Progress = Callable[[int], None]  # called with the number of input bytes just consumed


NOT_TEXT = "not a corpus file"


def _skip_reason(entry: Path) -> str | None:
    """Why a file found in a corpus folder is left out (None: it is read)."""
    name = entry.name
    if not name.lower().endswith(SUFFIXES):
        return NOT_TEXT
    if name.startswith(".#"):
        return "editor lock file"
    if name.startswith("."):
        return "hidden file"
    if entry.is_symlink() and not entry.exists():
        return "broken symlink"
    if entry.is_dir():
        return "a folder"
    if not entry.is_file():
        return "not a regular file"
    return None


def scan(folder: str | os.PathLike[str]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The folder rule (module docstring): the files read, and each (entry, reason) left out."""
    root = Path(folder)
    files: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    pending = [root]
    while pending:
        d = pending.pop()
        try:
            entries = sorted(d.iterdir(), key=lambda f: f.name)
        except OSError as e:
            raise LaminaError(f"cannot list the folder {d}: {e.strerror or e}") from None
        for entry in entries:
            if entry.is_dir() and not entry.name.lower().endswith(SUFFIXES):
                if entry.is_symlink():
                    skipped.append((entry, "symlink to a folder"))
                elif entry.name.startswith("."):
                    skipped.append((entry, "hidden folder"))
                else:
                    pending.append(entry)
                continue
            reason = _skip_reason(entry)
            if reason is None:
                files.append(entry)
            else:
                skipped.append((entry, reason))
    files.sort(key=lambda f: f.relative_to(root).as_posix())
    skipped.sort(key=lambda e: e[0].relative_to(root).as_posix())
    return files, skipped


def skipped_line(folder: Path, skipped: list[tuple[Path, str]], limit: int = 6) -> str:
    """One line naming what `scan` left out of `folder` (other files counted, a few named)."""
    rel = lambda e: e.relative_to(folder).as_posix()  # noqa: E731
    named = [f"{rel(e)} ({why})" for e, why in skipped if why != NOT_TEXT]
    others = [rel(e) for e, why in skipped if why == NOT_TEXT]
    parts = named[:limit] + ([f"{len(named) - limit} more"] if len(named) > limit else [])
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        n = len(others)
        parts.append(f"{n} other file{'s' * (n != 1)} ({shown})")
    return f"corpus folder {folder}: skipped {'; '.join(parts)}"


def corpus_files(path: str | os.PathLike[str]) -> list[Path]:
    """A file, or the files a folder contributes by the folder rule; every skip is named in one
    warning, and a folder with nothing to read is an error saying what it saw."""
    p = Path(path)
    if not p.exists():
        raise LaminaError(f"no such file or folder: {p}")
    if not p.is_dir():
        return [p]
    files, skipped = scan(p)
    if not files:
        found = f"; {skipped_line(p, skipped)}" if skipped else ""
        raise LaminaError(
            f"folder {p} has no {', '.join(SUFFIXES)} files (searched recursively, hidden "
            f"ones left out){found}"
        )
    if skipped:
        warnings.warn(skipped_line(p, skipped), LaminaWarning, stacklevel=3)
    return files


def total_bytes(files: list[Path]) -> int:
    return sum(f.stat().st_size for f in files)


class _Counted:
    """Counts bytes read from the file on disk (compressed bytes, for .gz)."""

    def __init__(self, f: BinaryIO, progress: Progress | None) -> None:
        self.f, self.progress = f, progress

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        if self.progress is not None and data:
            self.progress(len(data))
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.f.close()


def _raw_stream(path: Path, progress: Progress | None) -> BinaryIO:
    counted: Any = _Counted(open(path, "rb"), progress)  # noqa: SIM115 - closed by the caller
    gz = path.name.lower().endswith(".gz")
    return gzip.GzipFile(fileobj=counted, mode="rb") if gz else counted


def _blocks(path: Path, progress: Progress | None) -> Iterator[str]:
    """Decoded text of a file in pieces of about PIECE_CHARS, each cut after a newline."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    stream, done, carry, first = _raw_stream(path, progress), 0, "", True
    try:
        while True:
            try:
                raw = stream.read(PIECE_CHARS)
            except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
                what = "is cut short" if isinstance(e, EOFError) else f"is not valid gzip ({e})"
                raise LaminaError(f"{path} {what}; no output written") from e
            if b"\x00" in raw:
                raise LaminaError(f"{path} looks binary (NUL byte); expected UTF-8 text")
            try:
                text = carry + decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                raise LaminaError(
                    f"{path} is not valid UTF-8 near byte offset {done + e.start}"
                ) from e
            done += len(raw)
            if first and text.startswith("\ufeff"):
                text = text[1:]
            first = False
            if not raw:
                if text:
                    yield text
                return
            cut = text.rfind("\n") + 1
            if cut == 0 and len(text) < 4 * PIECE_CHARS:
                carry = text
                continue
            cut = cut or len(text)
            carry = text[cut:]
            yield text[:cut]
    finally:
        stream.close()


def _jsonl_docs(path: Path, skip_bad: bool, bad: list[int], progress: Progress | None):
    pending, lineno = "", 0
    for block in _blocks(path, progress):
        lines = (pending + block).split("\n")
        pending = lines.pop()
        for line in lines:
            lineno += 1
            yield from _jsonl_line(path, lineno, line, skip_bad, bad)
    if pending:
        yield from _jsonl_line(path, lineno + 1, pending, skip_bad, bad)


def _jsonl_line(path: Path, lineno: int, line: str, skip_bad: bool, bad: list[int]):
    if not line.strip():
        return
    try:
        obj = loads_json(line, f"{path} line {lineno}")
        problem = None if isinstance(obj, dict) and isinstance(obj.get("text"), str) else "text"
    except ValueError:
        problem = "json"
    if problem is None:
        yield obj["text"]
        return
    if not skip_bad:
        why = "is not JSON" if problem == "json" else 'has no "text" string'
        raise LaminaError(f"{path} line {lineno} {why}; pass --skip-bad-lines to skip such lines")
    bad[0] += 1


def read_pieces(
    files: list[Path], skip_bad: bool = False, bad: list[int] | None = None,
    progress: Progress | None = None,
) -> Iterator[tuple[str, bool]]:  # fmt: skip
    """(piece of text, whether it ends its document), for every document of every file."""
    bad = bad if bad is not None else [0]
    for f in files:
        if f.name.lower().endswith((".jsonl", ".jsonl.gz")):
            for text in _jsonl_docs(f, skip_bad, bad, progress):
                for i in range(0, max(len(text), 1), PIECE_CHARS):
                    yield text[i : i + PIECE_CHARS], i + PIECE_CHARS >= len(text)
        else:
            last = None
            for block in _blocks(f, progress):
                if last is not None:
                    yield last, False
                last = block
            yield last or "", True

"""File helpers every layer may import: atomic writes, JSON in and out, folder fsync.

The leaf at the bottom of the layer map: it imports only the standard library and
``lamina.errors``, so the data layer, checkpoints and training runs share one way of writing a
file that readers see either whole or not at all.

    ``atomic_write(path, write)``: call ``write(f)`` on a temp file beside ``path``, fsync it,
    ``os.replace`` it into place and fsync the folder.
    ``write_json(path, data)`` / ``read_json(path)``: UTF-8 JSON, written atomically; reading
    errors name the file.
    ``fsync_dir(folder)``: make renames inside ``folder`` durable where the platform allows.
    ``mute_stream(stream)``: point a broken output stream's descriptor at /dev/null.

What this module deliberately does not know: tensors, models, tokenizers and runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from lamina.errors import LaminaError

__all__ = ["atomic_write", "fsync_dir", "mute_stream", "read_json", "write_json"]


def mute_stream(stream: Any) -> None:
    """Point `stream`'s file descriptor at /dev/null (a broken pipe, a full device): later
    writes and the flush at exit then succeed. A no-op for a stream without a descriptor."""
    with contextlib.suppress(Exception):
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """fsync a folder so that renames inside it survive a crash; a no-op where unsupported."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write(f)`` on a temp file beside ``path``, fsync it, then ``os.replace`` it.

    Readers see either the old file or the complete new one, never a partial write. The
    folder must exist already. The temp file is removed if ``write`` raises.
    """
    p = Path(path)
    folder = p.parent
    if not folder.is_dir():
        raise LaminaError(f"cannot write {p}: folder {folder} does not exist")
    if p.is_dir():
        raise LaminaError(f"cannot write {p}: it is a folder")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    fsync_dir(folder)


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Atomic JSON write (temp file, fsync, rename)."""
    payload = (json.dumps(data, indent=2, sort_keys=False) + "\n").encode("utf-8")
    atomic_write(path, lambda f: f.write(payload))


def read_json(path: str | os.PathLike[str]) -> Any:
    """Parse a UTF-8 JSON file; a missing or malformed file raises ``LaminaError`` naming it."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise LaminaError(f"missing file: {p}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LaminaError(f"{p} is not valid JSON: {exc}") from exc

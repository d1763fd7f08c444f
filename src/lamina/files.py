"""File helpers every layer may import: the one output rule, atomic writes, JSON, folder fsync.

The leaf at the bottom of the layer map: it imports only the standard library and
``lamina.errors``, so the data layer, checkpoints and training runs share one way of writing a
file that readers see either whole or not at all.

The output rule, for every verb that writes (a file or a folder):
    1. every input is validated first (the verb's business; nothing here touches an output
       before ``write`` / ``build`` has run to its end);
    2. an output that is, holds or sits inside an input is refused (``refuse_overlap``);
    3. a file: a symlink is written through to its target; a character device or a FIFO is
       written directly (there is nothing to rename over); a block device or a socket is
       refused (``atomic_write``);
    4. a folder is built beside its final name and swapped in only once complete; an existing
       one is replaced only with ``force`` and only when lamina wrote it (the ``MARKER`` file
       it leaves in every folder it builds), or when it is empty (``build_folder``).

    ``atomic_write(path, write)``: call ``write(f)`` on a temp file beside ``path``, fsync it,
    ``os.replace`` it into place and fsync the folder (see rule 3 for links and devices).
    ``build_folder(out, build, force=, inputs=)``: rule 4; ``check_output_folder`` says up
    front whether it would refuse; ``mark_folder`` / ``is_lamina_folder`` for the marker.
    ``refuse_overlap(out, inputs)``: rule 2.
    ``write_json(path, data)`` / ``read_json(path)``: UTF-8 JSON, written atomically; reading
    errors name the file. ``loads_json(text, where)`` / ``json_lines(text, source)``: parsing
    that refuses data nested deeper than ``MAX_JSON_DEPTH`` (one line, never a RecursionError);
    ``check_depth(value, limit, where)`` measures any JSON-like value without recursing.
    ``to_json(data, **dumps_args)``: strict JSON text (NaN and infinities become null), what
    every --json line and JSONL output prints: jq and JSON.parse reject NaN.
    ``fsync_dir(folder)``: make renames inside ``folder`` durable where the platform allows.
    ``kind_of(path)``: "file", "folder", "FIFO", "character device", ... or "missing" (what a
    reader says when a path is not the regular file it needs: an existing FIFO is no "not
    found").
    ``mute_stream(stream)``: point a broken output stream's descriptor at /dev/null.

What this module deliberately does not know: tensors, models, tokenizers and runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from lamina.errors import LaminaError

__all__ = [
    "MARKER",
    "MAX_JSON_DEPTH",
    "atomic_write",
    "build_folder",
    "check_depth",
    "check_output_file",
    "check_output_folder",
    "check_writable",
    "fsync_dir",
    "is_lamina_folder",
    "json_lines",
    "kind_of",
    "loads_json",
    "mark_folder",
    "mute_stream",
    "read_json",
    "refuse_overlap",
    "to_json",
    "write_json",
]

MARKER = ".lamina"  # left in every folder lamina builds: `--force` replaces only those
MAX_JSON_DEPTH = 64  # arrays/objects inside each other; lamina's own formats use 4 at most
Inputs = Iterable[tuple[str, "str | os.PathLike[str] | None"]]  # (flag or name, path)


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


def kind_of(path: str | os.PathLike[str]) -> str:
    """What is at `path` (symlinks followed): "file", "folder", "FIFO", "character device",
    "block device", "socket", or "missing"."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "missing"
    kinds = [(stat.S_ISREG, "file"), (stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"),
             (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
             (stat.S_ISSOCK, "socket")]  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "special file")


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


def _real(path: str | os.PathLike[str]) -> Path:
    """`path` absolute, symlinks followed as far as they lead (the target may not exist)."""
    return Path(os.path.realpath(Path(path).expanduser()))


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def refuse_overlap(
    out: str | os.PathLike[str], inputs: Inputs, flag: str = "--out", *, inside: bool = True
) -> None:
    """Refuse an output that is an input, holds one (a folder above it) or sits inside one.

    inside=False (a file output): a file beside an input's files (a picture in its run folder)
    is fine; only the input itself is refused."""
    o = _real(out)
    for name, inp in inputs:
        if inp is None or str(inp) == "":
            continue
        i = _real(inp)
        if not i.exists():
            continue
        if o == i:
            raise LaminaError(f"{flag} {out} is {name} {inp}: writing it would destroy the input")
        if _inside(i, o):
            raise LaminaError(
                f"{flag} {out} holds {name} {inp}: writing it would destroy the input"
            )
        if inside and _inside(o, i):
            raise LaminaError(f"{flag} {out} sits inside {name} {inp}; write it elsewhere")


def check_output_file(
    path: str | os.PathLike[str],
    inputs: Inputs = (),
    flag: str = "--output",
    *,
    seekable: bool = False,
) -> Path:
    """Rules 2 and 3 for a file, before any work: the path to write (a symlink's target).
    `seekable`: the writer seeks in its file (a GGUF), so a FIFO is refused too."""
    p = Path(path)
    if str(path) == "":
        raise LaminaError(f"{flag} must name a file, got an empty string")
    refuse_overlap(p, inputs, flag, inside=False)
    target = _real(p)
    if target.is_dir():
        raise LaminaError(f"{flag} {p} is a folder: give a file name")
    if target.exists():
        mode = target.stat().st_mode
        if stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
            what = "a block device" if stat.S_ISBLK(mode) else "a socket"
            raise LaminaError(f"{flag} {p} is {what}; lamina writes files, FIFOs and char devices")
        if seekable and stat.S_ISFIFO(mode):
            raise LaminaError(f"{flag} {p} is a FIFO; this file is written with seeks: give a file")
    elif not target.parent.is_dir():
        raise LaminaError(f"{flag} {p}: folder {target.parent} does not exist")
    if not target.exists() or target.is_file():  # the temp file goes beside it
        check_writable(target.parent, flag, shown=p)
    return target


def atomic_write(
    path: str | os.PathLike[str], write: Callable[[IO[bytes]], Any], *, seekable: bool = False
) -> None:
    """Call ``write(f)`` on a temp file beside ``path``, fsync it, then ``os.replace`` it.

    Readers see either the old file or the complete new one, never a partial write. The
    folder must exist already. The temp file is removed if ``write`` raises. A symlink at
    ``path`` is written through (its target is replaced, the link stays); a character device
    or a FIFO is written directly; a block device or a socket is refused (with `seekable`, a
    FIFO too: for writers that seek).
    """
    p = Path(path)
    target = _real(p)
    folder = target.parent
    if target.is_dir():
        raise LaminaError(f"cannot write {p}: it is a folder")
    if target.exists() and not target.is_file():
        check_output_file(p, (), "cannot write", seekable=seekable)
        with _naming(p, str(target)), open(target, "wb") as f:  # a device or FIFO: as it is
            write(f)
        return
    if not folder.is_dir():
        raise LaminaError(f"cannot write {p}: folder {folder} does not exist")
    with _naming(p, str(folder / f".{target.name}.")):
        _write_beside(target, write)
    fsync_dir(folder)


@contextlib.contextmanager
def _naming(p: Path, hidden: str) -> Iterator[None]:
    """An OSError that names no file, or a temp file starting with `hidden`, names `p`: the
    user hears "No space left on device: model.gguf", never a temp name."""
    try:
        yield
    except OSError as e:
        if e.filename is None or str(e.filename).startswith(hidden):
            e.filename = str(p)
        raise


def _write_beside(target: Path, write: Callable[[IO[bytes]], Any]) -> None:
    folder = target.parent
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with contextlib.suppress(OSError):  # keep the mode a plain open() would give
            umask = os.umask(0)
            os.umask(umask)
            mode = target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~umask
            os.chmod(tmp_name, mode)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def mark_folder(folder: str | os.PathLike[str], kind: str) -> None:
    """Leave the marker that says lamina wrote `folder` (what `--force` may replace)."""
    atomic_write(Path(folder) / MARKER, lambda f: f.write(f"written by lamina: {kind}\n".encode()))


def is_lamina_folder(folder: str | os.PathLike[str]) -> bool:
    """Whether `folder` holds the marker lamina leaves in what it builds."""
    return (Path(folder) / MARKER).is_file()


def check_output_folder(
    out: str | os.PathLike[str], *, force: bool, inputs: Inputs = (), flag: str = "--out"
) -> Path:
    """Rules 2 and 4 before any work: refuse what `build_folder` would refuse; the real path."""
    p = Path(out)
    if str(out) == "":
        raise LaminaError(f"{flag} must name a folder, got an empty string")
    refuse_overlap(p, inputs, flag)
    target = _real(p)
    if target.exists() and not target.is_dir():
        raise LaminaError(f"{flag} {p} exists and is not a folder")
    if target.is_dir() and any(target.iterdir()):
        if not is_lamina_folder(target):
            raise LaminaError(
                f"{flag} {p} holds files lamina did not write; pick a new folder "
                "(--force replaces only a folder lamina wrote)"
            )
        if not force:
            raise LaminaError(f"{flag} {p} already exists; pick a new folder or pass --force")
    check_writable(target, flag, shown=p)
    return target


def check_writable(path: str | os.PathLike[str], flag: str, shown: Any = None) -> None:
    """Refuse, before any work, a place that cannot be written: a file where a folder should
    be (`/etc/passwd/x`), a read-only or pseudo file system (`/proc`). Probes by creating and
    removing one empty temp file in the nearest existing folder; errors name `flag` and
    `shown` (default `path`), never a temp path."""
    shown = path if shown is None else shown
    base = Path(path)
    while not base.exists() and base.parent != base:
        base = base.parent
    if not base.is_dir():
        raise LaminaError(f"{flag} {shown}: {base} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".lamina-probe-", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise LaminaError(f"{flag} {shown}: cannot write in {base} ({e.strerror or e})") from None


def build_folder(
    out: str | os.PathLike[str],
    build: Callable[[Path], Any],
    *,
    kind: str,
    force: bool = False,
    inputs: Inputs = (),
    flag: str = "--out",
) -> Path:
    """Call ``build(tmp)`` on a new folder beside `out`, mark it, then swap it into place.

    An existing `out` (a symlink: its target) is replaced only once the new folder is complete,
    only with `force`, and only if lamina wrote it or it is empty. A failure (an error, a full
    disk, Ctrl-C) removes the new folder and leaves `out` as it was.
    """
    target = check_output_folder(out, force=force, inputs=inputs, flag=flag)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=target.parent))
    old: Path | None = None
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)
        build(tmp)
        mark_folder(tmp, kind)
        check_output_folder(out, force=force, inputs=inputs, flag=flag)  # still ours to replace
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / "previous")
        os.replace(tmp, target)
    except BaseException:
        if old is not None and not target.exists():
            os.replace(old / "previous", target)
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(target.parent)
    return Path(out)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def to_json(data: Any, **dumps_args: Any) -> str:
    """`json.dumps(data)` as strict JSON: a NaN or an infinity anywhere becomes null."""
    return json.dumps(_finite(data), allow_nan=False, **dumps_args)


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Atomic JSON write (temp file, fsync, rename)."""
    payload = (json.dumps(data, indent=2, sort_keys=False) + "\n").encode("utf-8")
    atomic_write(path, lambda f: f.write(payload))


def read_json(path: str | os.PathLike[str]) -> Any:
    """Parse a UTF-8 JSON file; a missing or malformed file raises ``LaminaError`` naming it."""
    p = Path(path)
    try:
        return loads_json(p.read_text(encoding="utf-8"), str(p))
    except FileNotFoundError as exc:
        raise LaminaError(f"missing file: {p}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LaminaError(f"{p} is not valid JSON: {exc}") from exc


def json_lines(text: str, source: str) -> Iterator[tuple[str, Any]]:
    """The JSON value of each non-blank line of a JSONL text, with where it stands
    ("SOURCE line N"); a line that is not JSON raises ``LaminaError`` naming it."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{source} line {n}"
        try:
            yield where, loads_json(line, where)
        except json.JSONDecodeError as exc:
            raise LaminaError(f"{where}: not valid JSON ({exc.msg})") from None


def _too_deep(where: str, limit: int) -> LaminaError:
    return LaminaError(f"{where}: arrays and objects nest deeper than {limit} levels")


def check_depth(value: Any, limit: int, where: str) -> Any:
    """`value` if its lists/dicts nest at most `limit` deep; else LaminaError naming `where`.

    Iterative (no recursion of its own), so any depth is measured without a RecursionError."""
    stack = [(value, 0)] if isinstance(value, (list, tuple, dict)) else []
    while stack:
        item, depth = stack.pop()
        if depth >= limit:
            raise _too_deep(where, limit)
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (list, tuple, dict)))
    return value


def loads_json(text: str | bytes, where: str, limit: int = MAX_JSON_DEPTH) -> Any:
    """json.loads, refusing data nested deeper than `limit` (json's own recursion included);
    a syntax error is left to the caller (json.JSONDecodeError)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(where, limit) from None
    brackets = ("[", "{") if isinstance(text, str) else (b"[", b"{")
    if sum(text.count(b) for b in brackets) > limit:  # type: ignore[arg-type]
        check_depth(value, limit, where)
    return value

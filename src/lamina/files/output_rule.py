"""The output rule for a file: refuse an output that overlaps an input, write it atomically.

    refuse_overlap(out, inputs)       rule 2: an output that is, holds or sits inside an input
    check_output_file(path, inputs)   rules 2 and 3 before any work; the path to write
    atomic_write(path, write)         write(f) on a temp file beside path, fsync, os.replace
    check_writable(path, flag)        refuse a place that cannot be written, before any work
    fsync_dir(folder)                 make renames inside a folder durable
    real_path(path)                   absolute, symlinks followed as far as they lead
    kind_of(path)                     "file", "folder", "FIFO", ... or "missing"
    mute_stream(stream)               point a broken output stream at /dev/null

(The rules are numbered in lamina.files.) Deliberately unaware of folders lamina builds
(folders.py) and of JSON (json_files.py).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from lamina.errors import LaminaError

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


def real_path(path: str | os.PathLike[str]) -> Path:
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
    o = real_path(out)
    for name, inp in inputs:
        if inp is None or str(inp) == "":
            continue
        i = real_path(inp)
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
    target = real_path(p)
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
    target = real_path(p)
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

"""One writer per run folder: an exclusive `fcntl.flock` on `RUN/.lock`, which holds its pid.

    lock, stale_pid = take(folder)   # or a LaminaError naming the pid that holds it
    lock.close()                     # empty the file and give the lock back (safe twice)

The lock is kept for as long as its holder keeps it (the kernel drops it when the process
dies), and the holder's pid is written into the file, so a second process is refused in one
line naming that pid. `close()` empties the file: a pid still in it when the lock is next
taken names a process that died holding it (`stale_pid`, for the caller to report). Within
one process a folder already locked is shared, not taken twice (a test, or a resume after a
run in the same Python session); its `stale_pid` is then None.

Deliberately unaware of what a run folder holds (run_dir.py): it locks a folder.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from lamina.errors import LaminaError

LOCK = ".lock"


class RunLock:
    """An open, flock-ed lock file; shared by the holders of one process on one folder."""

    def __init__(self, fd: int, key: tuple[int, int]) -> None:
        self.fd: int | None = fd
        self.key = key

    def close(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        os.close(self.fd)  # closing the last descriptor drops the flock
        self.fd = None
        if _HELD.get(self.key) is self:
            del _HELD[self.key]


_HELD: dict[tuple[int, int], RunLock] = {}  # (device, inode) of a folder -> this process's lock


def os_message(exc: OSError) -> str:
    """An OSError as the few words a one-line message quotes."""
    return exc.strerror or str(exc)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def take(folder: Path) -> tuple[RunLock, int | None]:
    """The folder's exclusive lock and the pid a dead holder left in it (or refuse, naming
    the pid that holds it)."""
    import fcntl

    path = folder / LOCK
    try:
        st = os.stat(folder)
        key = (st.st_dev, st.st_ino)
        if key in _HELD:  # this process holds it already
            return _HELD[key], None
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise LaminaError(f"cannot write to {folder}: {os_message(exc)}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _read_pid(fd)
        os.close(fd)
        who = f"pid {holder}" if holder else "another process"
        raise LaminaError(
            f"{folder} is in use by another lamina train ({who}); wait for it to "
            "finish or choose another folder"
        ) from None
    stale_pid = _read_pid(fd)  # a pid left in the file: its process died holding it
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:
        os.close(fd)
        raise LaminaError(f"cannot write to {folder}: {os_message(exc)}") from exc
    lock = _HELD[key] = RunLock(fd, key)
    return lock, stale_pid

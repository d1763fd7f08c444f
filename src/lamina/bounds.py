"""Time and memory bounds for work whose size comes from a file (a chat template, a request,
a context length a model claims).

    deadline(seconds, what)      a context manager: the Python code inside it is stopped once
                                 `seconds` have passed, and the block raises LaminaError("WHAT
                                 took longer than S s ..."); usable in any thread
    free_memory() -> int | None  bytes this machine (or its cgroup) can still give, None where
                                 unknown
    check_fits(nbytes, what, free=None)   LaminaError naming WHAT and both sizes when an
                                 allocation of `nbytes` cannot fit (`free`: a device's, else
                                 free_memory()), before it is tried

How the deadline stops code: one watchdog thread for the process, once a block's time is up,
raises `_Expired` (a BaseException, so no ``except Exception`` inside the block swallows it) in
the thread that entered the block (CPython's PyThreadState_SetAsyncExc); arming a deadline costs
a lock and a list append, so renders in a loop start no thread each. The exception lands at the
next bytecode boundary, so pure Python (a template engine's loops) stops within milliseconds;
one long call into C (multiplying a huge string) finishes first, which is why the callers also
bound the sizes they let such calls build. Leaving the block disarms it and clears an exception
that was raised but not yet delivered, so nothing fires after the block. Code inside a block
must not import a module for the first time (an exception landing in an import leaves a package
half-initialised for the whole process): callers import what the work needs first.

What this module deliberately does not know: what the bounded work is. A leaf: it imports only
the standard library and `lamina.errors`.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Iterator
from typing import Any

from lamina.errors import LaminaError

__all__ = ["check_fits", "deadline", "free_memory", "human_bytes"]


class _Expired(BaseException):
    """Raised inside a `deadline` block when its time is up (never seen outside it)."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class _Watchdog:
    """One daemon thread for every deadline of the process: it sleeps until the earliest one
    and raises `_Expired` in the thread that entered it (arming costs a lock, not a thread)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.active: list[list[Any]] = []  # [expiry, thread id, state]
        self.thread: threading.Thread | None = None

    def arm(self, seconds: float) -> list[Any]:
        entry = [time.monotonic() + seconds, threading.get_ident(), "running"]
        with self.cond:
            self.active.append(entry)
            if self.thread is None or not self.thread.is_alive():  # first use, or after fork
                self.thread = threading.Thread(
                    target=self._run, name="lamina-deadline", daemon=True
                )
                self.thread.start()
            self.cond.notify()
        return entry

    def disarm(self, entry: list[Any]) -> bool:
        """Whether it fired; an exception raised but not yet delivered is dropped."""
        with self.cond:
            fired = entry[2] == "fired"
            if fired:
                _raise_in(entry[1], None)
            entry[2] = "done"
            if entry in self.active:
                self.active.remove(entry)
        return fired

    def _run(self) -> None:
        with self.cond:
            while True:
                now = time.monotonic()
                for entry in self.active:
                    if entry[2] == "running" and entry[0] <= now:
                        entry[2] = "fired"
                        _raise_in(entry[1], _Expired)
                waiting = [e[0] for e in self.active if e[2] == "running"]
                self.cond.wait(max(0.0, min(waiting) - now) if waiting else None)


_WATCHDOG = _Watchdog()


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Stop the block's Python code after `seconds`; LaminaError naming `what` and the limit."""
    expired = f"{what} took longer than {seconds:g} s, so it was stopped"
    entry: list[Any] | None = None
    try:
        try:
            entry = _WATCHDOG.arm(seconds)
            yield
        finally:
            if entry is not None:
                _WATCHDOG.disarm(entry)  # a pending exception may land here: the except has it
    except _Expired:
        if entry is not None:
            _WATCHDOG.disarm(entry)
        raise LaminaError(expired) from None


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _read_int(path: str, key: str | None = None) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                parts = line.split()
                if key is None:
                    return int(parts[0]) if parts and parts[0].isdigit() else None
                if parts and parts[0] == key and parts[1].isdigit():
                    return int(parts[1]) * 1024  # /proc/meminfo counts kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def free_memory() -> int | None:
    """What can still be allocated: the kernel's MemAvailable, or less where a cgroup limit
    (a container's memory.max) leaves less; None where neither can be read."""
    found = [_read_int("/proc/meminfo", "MemAvailable:")]
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        found.append(max(0, limit - used))
    known = [n for n in found if n is not None]
    return min(known) if known else None


def check_fits(nbytes: int, what: str, free: int | None = None) -> None:
    """Refuse, naming `what` and both sizes, an allocation that cannot fit in memory."""
    room = free_memory() if free is None else free
    if room is not None and nbytes > room:
        raise LaminaError(
            f"{what} would take {human_bytes(nbytes)}, more than the {human_bytes(room)} of "
            "memory free here"
        )

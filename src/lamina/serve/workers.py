"""Threads for the server's jobs: daemon workers and admission tickets.

    Workers(n, name).submit(fn, *args) -> Future     calls run in order on n daemon threads
    Workers.close(wait=2.0)                         cancel what waits, give the running some time
    Ticket(leave).release()                         one admitted request's place, given back once
    Mail(loop).post(queue, item)                    from any thread: item onto an asyncio queue

Daemon threads because a ThreadPoolExecutor's are joined at exit: one call stuck in a chat
template or a model step would keep the process from stopping on Ctrl-C.

`Mail` carries the batch thread's events to the event loop: those posted before the loop runs
its callback travel together, so a turn's tokens for many streams cost one wake-up of the loop
(one byte to a socket it watches) instead of one each. Where the loop can watch a socket
(`add_reader`: selector loops) the byte is written by a foreign call that keeps the interpreter
lock (`ctypes.PyDLL`), so the woken loop waits for the lock until the batch thread lets it go
in its next native step, instead of taking it in the middle of the write and holding the batch
thread's Python (loop.call_soon_threadsafe's write gives the lock up); elsewhere it is
call_soon_threadsafe.

Deliberately unaware of models and HTTP.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import queue
import socket
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class Ticket:
    """One admitted request; `release` (idempotent) gives its place back."""

    def __init__(self, leave: Callable[[], None]) -> None:
        self._leave, self._done = leave, False

    def release(self) -> None:
        if not self._done:
            self._done = True
            self._leave()


class Workers:
    """A few daemon threads running submitted calls in order (a ThreadPoolExecutor's threads
    are joined at exit, so one stuck call would keep the process from stopping)."""

    def __init__(self, n: int, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(n)
        ]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        if self._closed:
            future.cancel()
        else:
            self._jobs.put((future, fn, args))
        return future

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)

    def close(self, wait: float = 2.0) -> None:
        """Cancel what waits; let running calls end (up to `wait` seconds, then leave them)."""
        self._closed = True
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self._threads:
            self._jobs.put(None)
        end = time.monotonic() + wait
        for t in self._threads:
            t.join(timeout=max(0.0, end - time.monotonic()))


def _holding_write() -> Callable[[int, bytes, int], int] | None:
    """libc's write(2) called without giving up the interpreter lock, or None where there is
    no such symbol."""
    try:
        write = ctypes.PyDLL(None).write
    except (OSError, AttributeError, TypeError):
        return None
    write.argtypes, write.restype = (
        [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t],
        ctypes.c_ssize_t,
    )
    return write


_WRITE = _holding_write() if os.name == "posix" else None


class Mail:
    """Items for asyncio queues of one event loop, from any thread (see the module docstring).
    Make it on the loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = weakref.ref(loop)  # a mailbox kept beside its loop does not keep it alive
        self.lock = threading.Lock()
        self.items: list[tuple[asyncio.Queue, Any]] = []
        self._bell: tuple[socket.socket, socket.socket] | None = None
        if _WRITE is not None:
            pair = socket.socketpair()
            for s in pair:
                s.setblocking(False)
            try:
                loop.add_reader(pair[0].fileno(), self._rung)
            except (NotImplementedError, RuntimeError):
                for s in pair:
                    s.close()
            else:
                self._bell = pair
                weakref.finalize(self, Mail._close, self.loop, pair)  # not the loop itself

    @staticmethod
    def _close(ref: weakref.ref, pair: tuple[socket.socket, ...]) -> None:
        loop = ref()
        if loop is not None and not loop.is_closed():
            loop.remove_reader(pair[0].fileno())
        for s in pair:
            s.close()

    def post(self, into: asyncio.Queue, item: Any) -> None:
        """Put item on `into`, on the loop's thread (RuntimeError once the loop has closed)."""
        loop = self.loop()
        if loop is None or loop.is_closed():
            raise RuntimeError("the event loop is gone")
        with self.lock:
            self.items.append((into, item))
            if len(self.items) > 1:  # the first one's wake-up is on its way
                return
        if self._bell is not None and _WRITE is not None:
            _WRITE(self._bell[1].fileno(), b"\0", 1)  # full (the loop is behind): it will read
            return
        try:
            loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:
            with self.lock:
                self.items.clear()
            raise

    def _rung(self) -> None:
        try:
            while self._bell is not None and self._bell[0].recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        self._deliver()

    def _deliver(self) -> None:
        with self.lock:
            items, self.items = self.items, []
        for into, item in items:
            into.put_nowait(item)

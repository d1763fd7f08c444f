"""A time bound for work whose length comes from a file (a chat template, a request).

    deadline(seconds, what)      a context manager: the Python code inside it is stopped once
                                 `seconds` have passed, and the block raises LaminaError("WHAT
                                 took longer than S s ..."); usable in any thread

How the deadline stops code: a timer thread, once the time is up, raises `_Expired` (a
BaseException, so no ``except Exception`` inside the block swallows it) in the thread that
entered the block (CPython's PyThreadState_SetAsyncExc). The exception lands at the next
bytecode boundary, so pure Python (a template engine's loops) stops within milliseconds; one long
call into C (multiplying a huge string) finishes first, which is why the callers also bound the
sizes they let such calls build. Leaving the block disarms the timer and clears an exception
that was raised but not yet delivered, so nothing fires after the block.

What this module deliberately does not know: what the bounded work is. A leaf: it imports only
the standard library and `lamina.errors`.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator

from lamina.errors import LaminaError

__all__ = ["deadline"]


class _Expired(BaseException):
    """Raised inside a `deadline` block when its time is up (never seen outside it)."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Stop the block's Python code after `seconds`; LaminaError naming `what` and the limit."""
    thread_id, lock, state = threading.get_ident(), threading.Lock(), ["running"]

    def fire() -> None:
        with lock:
            if state[0] == "running":
                state[0] = "fired"
                _raise_in(thread_id, _Expired)

    def disarm() -> bool:
        timer.cancel()
        with lock:
            fired = state[0] == "fired"
            if fired:
                _raise_in(thread_id, None)  # one raised but not yet delivered is dropped
            state[0] = "done"
        return fired

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    expired = f"{what} took longer than {seconds:g} s, so it was stopped"
    try:
        try:
            timer.start()
            yield
        finally:
            disarm()  # the pending exception may be delivered here: the outer except has it
    except _Expired:
        disarm()
        raise LaminaError(expired) from None

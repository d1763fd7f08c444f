"""What a run shows: a tqdm bar on a terminal or plain lines (loss.png: `pictures.loss_curves`).

    Progress(total, quiet, every, stream) ; update(step, loss, lr, tok_per_s, eta_s) ;
    message(text) ; close()
    Heartbeat(progress, label, parts=1, after=5, every=10)   while a long call runs (a step of
        many micro-batches, an evaluation), a line every `every` seconds once `after` have
        passed: "step 3: 12 s so far, micro-batch 5/8" (`at(i)` says which part is running),
        from a timer thread (none with enabled=False)

On a TTY (and not quiet) a tqdm bar shows step, loss, learning rate, tokens/s and ETA. When
stdout is not a terminal, or with quiet, a plain line is printed every `every` steps instead
(log files and CI stay readable). Evaluations and notices go through `message`, which writes
above the bar. This is the one training module that writes to the terminal. If the stream
breaks (stdout closed, or piped into `head` that has exited), output is switched off and
training carries on: `safe_print` never raises for a broken stream.

Deliberately unaware of models, optimizers, files and what a step computes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

from lamina.files import mute_stream


def silence_stdout() -> None:
    """Point fd 1 and sys.stdout at /dev/null, so later writes and the exit flush succeed."""
    mute_stream(sys.__stdout__)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process


def safe_print(text: str, stream: TextIO | None = None) -> bool:
    """print + flush; False (and stdout silenced if it was the stream) when the stream broke."""
    out = stream or sys.stdout
    if out is None:  # started with stdout closed
        return False
    try:
        print(text, file=out, flush=True)
    except (BrokenPipeError, OSError, ValueError):  # ValueError: the file was closed
        if out is sys.stdout or out is sys.__stdout__:
            silence_stdout()
        return False
    return True


def format_seconds(seconds: float) -> str:
    """7 -> '7s', 95 -> '1m35s', 3725 -> '1h02m'."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Progress:
    """A bar (terminal) or periodic lines (pipes, --quiet)."""

    def __init__(
        self,
        total: int | None,
        *,
        quiet: bool = False,
        every: int = 10,
        stream: TextIO | None = None,
        initial: int = 0,
    ) -> None:
        self.stream = stream or sys.stdout
        self.every = max(1, every)
        self.bar = None
        isatty = getattr(self.stream, "isatty", lambda: False)()
        if isatty and not quiet:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total, initial=initial, file=self.stream, unit="step", dynamic_ncols=True
            )

    def set_total(self, total: int) -> None:
        if self.bar is not None and self.bar.total != total:
            self.bar.total = total
            try:
                self.bar.refresh()
            except (OSError, ValueError):
                self._broken()

    def update(
        self, step: int, loss: float, lr: float, tok_per_s: float, eta_s: float | None
    ) -> None:
        eta = "?" if eta_s is None else format_seconds(eta_s)
        if self.bar is not None:
            self.bar.n = step
            try:
                self.bar.set_postfix_str(
                    f"loss {loss:.4f} lr {lr:.2e} {tok_per_s:,.0f} tok/s ETA {eta}", refresh=True
                )
            except (OSError, ValueError):
                self._broken()
        elif step % self.every == 0 or step == 1:
            self._print(
                f"step {step:6d}  loss {loss:.4f}  lr {lr:.2e}  {tok_per_s:8,.0f} tok/s  ETA {eta}"
            )

    def message(self, text: str) -> None:
        if self.bar is not None:
            try:
                self.bar.write(text, file=self.stream)
            except (OSError, ValueError):
                self._broken()
        else:
            self._print(text)

    def _print(self, text: str) -> None:
        if self.stream is not None and not safe_print(text, self.stream):
            self._broken()

    def _broken(self) -> None:
        """The stream is gone: no more output, training goes on."""
        if self.stream is sys.stdout or self.stream is sys.__stdout__:
            silence_stdout()
        self.bar = None
        self.stream = None

    def close(self) -> None:
        if self.bar is not None:
            try:
                self.bar.close()
            except (OSError, ValueError):
                self._broken()
            self.bar = None


class Heartbeat:
    """Shows that a long call is alive, through `progress.message`."""

    def __init__(
        self, progress: Progress, label: str, parts: int = 1, after: float = 5.0,
        every: float = 10.0, enabled: bool = True,
    ) -> None:  # fmt: skip
        self.progress, self.label, self.parts, self.enabled = progress, label, parts, enabled
        self.after, self.every, self.part = after, every, 0
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        self._start = time.perf_counter()
        if self.enabled:  # off: no thread at all (steps of milliseconds pay nothing)
            self._thread = threading.Thread(target=self._beat, daemon=True)
            self._thread.start()
        return self

    def _beat(self) -> None:
        wait = self.after
        while not self._done.wait(wait):
            self.progress.message(self.words(time.perf_counter() - self._start))
            wait = self.every

    def at(self, part: int) -> None:
        """Part `part` (0-based) of `parts` is running now."""
        self.part = part

    def words(self, seconds: float) -> str:
        where = f", micro-batch {self.part + 1}/{self.parts}" if self.parts > 1 else ""
        return f"{self.label}: {seconds:.0f} s so far{where}"

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

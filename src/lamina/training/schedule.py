"""The learning-rate schedule and the wall-clock budget it is laid over (--max-time).

    schedule(peak, warmup, floor_ratio, kind, decay_fraction) -> lr(step, total)  checked once
    lr_at(step, total, peak, warmup, floor_ratio, kind, ...) -> float   the same, in one call
        step 0 .. warmup-1: linear warmup, peak * (step + 1) / (warmup + 1)   (never 0)
        then cosine or linear decay from peak, reaching peak * floor_ratio exactly at
        step total - 1 (the last optimizer step is fully decayed), and staying there;
        or "wsd" (warmup-stable-decay): flat at peak, then linear to the floor over the last
        round(decay_fraction * total) steps (never starting before warmup ends), reaching it
        at step total - 1. A function of (step, total), so TimeBudget's re-estimated total
        moves the decay's start with it.

    parse_duration("5m") -> 300.0   the command line's --max-time, in seconds

    TimeBudget(seconds): given the steps done and the clock, how many steps fit in the rest of
    the budget? Seconds per step are measured after a few warm-up steps (compilation and
    first-call costs excluded) as a running average over every step since, so periodic
    evaluations and checkpoints are amortised; a reserve for the final evaluation and save is
    kept back. `plan(step, now)` returns the estimated total step count (re-estimated at
    every step), or `step` itself when no further step fits: the caller stops there.

Deliberately unaware of optimizers, models, data and files.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from lamina.errors import LaminaError

DECAYS = ("cosine", "linear", "wsd")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|m|h|)\s*$", re.IGNORECASE)


def parse_duration(text: str | float | int) -> float:
    """'90s', '5m', '1.5h', '90' -> seconds (float > 0); anything else is a LaminaError."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        m = _DURATION.match(str(text))
        if not m:
            raise LaminaError(
                f"cannot parse duration {text!r}: use a number with an optional unit, "
                "e.g. 90s, 5m, 1.5h"
            )
        seconds = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(seconds) or seconds <= 0:
        raise LaminaError(f"duration must be positive, got {text!r}")
    return seconds


def schedule(
    peak: float,
    warmup: int = 0,
    floor_ratio: float = 0.1,
    kind: str = "cosine",
    decay_fraction: float = 0.2,
) -> Callable[[int, int], float]:
    """`lr(step, total)` for optimizer step `step` (0-based) of a run of `total` steps."""
    if kind not in DECAYS:
        raise LaminaError(f"decay must be one of {', '.join(DECAYS)}, got {kind!r}")
    if kind == "wsd" and not (isinstance(decay_fraction, (int, float)) and 0 < decay_fraction <= 1):
        raise LaminaError(f"decay_fraction must be in (0, 1], got {decay_fraction!r}")
    floor, cosine = peak * floor_ratio, kind == "cosine"

    def lr(step: int, total: int) -> float:
        if step < warmup:
            return peak * (step + 1) / (warmup + 1)
        if kind == "wsd":
            # stable at the peak, then linear to the floor over the last decay_fraction of the
            # steps, reaching it at step total - 1 (as the other shapes do)
            length = max(1, round(decay_fraction * total))
            start = max(warmup, total - length)
            span = total - 1 - start
            if step < start:
                return peak
            progress = 1.0 if span <= 0 else min(1.0, (step - start) / span)
            return peak - progress * (peak - floor)
        span = total - 1 - warmup
        progress = 1.0 if span <= 0 else min(1.0, max(0.0, (step - warmup) / span))
        coeff = 0.5 * (1.0 + math.cos(math.pi * progress)) if cosine else 1.0 - progress
        return floor + coeff * (peak - floor)

    return lr


def lr_at(
    step: int,
    total: int,
    peak: float,
    warmup: int = 0,
    floor_ratio: float = 0.1,
    kind: str = "cosine",
    decay_fraction: float = 0.2,
) -> float:
    """Learning rate for optimizer step `step` (0-based) of a run of `total` steps."""
    return schedule(peak, warmup, floor_ratio, kind, decay_fraction)(step, total)


class TimeBudget:
    """Estimates how many optimizer steps fit in a wall-clock budget.

    seconds: the budget for the steps still to run (a resumed run passes what is left).
    settle: steps excluded from the rate measurement (first-call and compile costs).
    """

    def __init__(self, seconds: float, *, settle: int = 3, first_guess: float = 1.0) -> None:
        if not seconds > 0:
            raise LaminaError(f"time budget must be positive, got {seconds!r}")
        self.seconds = float(seconds)
        self.settle = settle
        self.first_guess = first_guess  # seconds per step before any is measured
        self.start: float | None = None
        self.reserve = 0.0  # seconds kept back for the final evaluation and save
        self._mark: tuple[int, float] | None = None  # (steps done, time) once settled
        self._first_step: float | None = None

    def begin(self, now: float) -> None:
        self.start = now

    def set_reserve(self, seconds: float) -> None:
        """Time needed after the last step (final evaluation, plot and checkpoint)."""
        self.reserve = max(0.0, float(seconds))

    def seconds_per_step(self, steps_done: int, now: float) -> float:
        if self._mark is None:
            return self._first_step or self.first_guess
        mark_steps, mark_time = self._mark
        if steps_done <= mark_steps:
            return self._first_step or self.first_guess
        return (now - mark_time) / (steps_done - mark_steps)

    def observe(self, steps_done: int, now: float, took: float | None = None) -> None:
        """Call after each step with the number of steps done in this budget and the clock
        (`took`: the step's own seconds, so that setup before the first is not counted)."""
        if self.start is None:
            raise LaminaError("TimeBudget.begin() must be called first")
        if steps_done == 1:
            self._first_step = now - self.start if took is None else took
        if steps_done == self.settle and self._mark is None:
            self._mark = (steps_done, now)

    def plan(self, steps_done: int, step: int, now: float) -> int:
        """Estimated total steps of the run (`step` = global steps so far; `step` = stop now)."""
        if self.start is None:
            raise LaminaError("TimeBudget.begin() must be called first")
        left = self.seconds - (now - self.start) - self.reserve
        rate = max(self.seconds_per_step(steps_done, now), 1e-6)
        more = int(left // rate)
        if steps_done == 0 and left >= 0.5 * rate:  # the first step is tried if half of it fits
            more = max(more, 1)
        return step + max(0, more)

    def fits(self, now: float, seconds: float) -> bool:
        """Whether `seconds` more fit in the budget."""
        return self.start is None or self.seconds - (now - self.start) >= seconds

    def elapsed(self, now: float) -> float:
        return 0.0 if self.start is None else now - self.start

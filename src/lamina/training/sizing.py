"""Sizing a run to its --max-time: a measured probe step picks the batch, the evaluations' size
and the warmup, so the first step comes early and each step is a small share of the budget.

    size_to_budget(session, placement, clock, elapsed, given, notify) -> Session
        the session with batch_size, micro_batch_size, eval_batches (and warmup, unless typed)
        chosen from two timed micro-steps of one sequence and one timed forward; the choice is
        printed through `notify` and recorded in train_config.json
    choose(budget, seconds_per_item, ...) -> Sizing     the arithmetic, on its own (tested
        with made-up timings)

The rules. A step of the default batch that takes at most MAX_STEP_SHARE of the budget keeps
the default batch. Otherwise the batch is the number of sequences that take STEP_SHARE of the
budget (at least one), in micro-batches of at most MICRO_TOKENS tokens. An evaluation gets
EVAL_SHARE of the budget: the held-out windows that fit in it (at least two, for a standard
error; at most what the defaults would evaluate), the same windows at every evaluation. The
warmup is at most a tenth of the steps the budget leaves room for. "The budget" here is what
setup (the plan's timing, the tokenizer, tokenizing, loading) left of --max-time, which counts
from the process's start.

The probe times micro-steps of one sequence and keeps the fastest (the first also pays
one-off costs: kernels chosen and compiled for the shape): a second one unless the first alone
took PROBE_SHARE of the budget, then more (PROBE_TIMINGS in all) while the probe has spent
under PROBE_REPEAT_SHARE, so one stalled micro-step on a busy machine cannot shrink the batch
(a stalled pair once cut a 100 s speedrun's batch from 48 to 4). A fastest timing that would
cut the default batch is confirmed: timings go on while the probe has spent under
PROBE_CONFIRM_SHARE, until one says the default batch fits, so a stall longer than the first
window cannot cut it either (one of over 1 s, 0.28 s a sequence, cut a batch from 48 to 8 and
the run scored 1.647 against ~1.51); a step truly that slow pays the longer probe once. A forward still running at
PROBE_SHARE is cut off at its next block (`deadline`, OutOfTime) and the step estimated from
the blocks it finished. The loop uses the same `deadline` to drop a step still running when
the budget's steps must end. The probe's sequence is drawn with the objective's generator and
the generator put back, so the steps that follow draw what they would have drawn; its
gradients are dropped.

Deliberately unaware of the command line, the run directory's layout and what a model computes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lamina.modes import eval_mode
from lamina.training.device import autocast
from lamina.training.objectives import to_device
from lamina.training.session import Placement, Session

STEP_SHARE = 0.025  # a step sized by the probe: 2.5% of the budget (the middle of 1-5%)
MAX_STEP_SHARE = 0.05  # the default batch is kept while its step takes at most this share
EVAL_SHARE = 0.04  # one evaluation: at most this share of the budget
MICRO_TOKENS = 2048  # tokens per micro-batch at most (memory of one forward and backward)
PROBE_SHARE = 0.1  # a first micro-step longer than this share of the budget is not repeated
PROBE_REPEAT_SHARE = 0.01  # further micro-steps are timed while the probe spent less
PROBE_TIMINGS = 5  # micro-steps timed at most (unless a cut is being confirmed)
PROBE_CONFIRM_SHARE = 0.03  # a timing that would cut the default batch: confirmed until this


@dataclass(frozen=True)
class Sizing:
    batch_size: int
    micro_batch_size: int
    eval_rows: int  # held-out sequences per evaluation
    step_seconds: float  # the predicted seconds of one optimizer step
    probed: bool  # False: the default batch fits, kept


def choose(
    budget: float,
    train_item: float,
    eval_item: float,
    *,
    batch_size: int,
    micro_batch_size: int,
    seq_len: int,
    eval_rows: int,
) -> Sizing:
    """The batch and evaluation size for `budget` seconds, given the seconds one sequence takes
    in a training micro-step (`train_item`) and in a forward (`eval_item`)."""
    rows = max(2, min(eval_rows, int(EVAL_SHARE * budget / max(eval_item, 1e-9))))
    if train_item * batch_size <= MAX_STEP_SHARE * budget:
        return Sizing(batch_size, micro_batch_size, rows, train_item * batch_size, False)
    items = max(1, min(batch_size, int(STEP_SHARE * budget / max(train_item, 1e-9))))
    micro = min(items, max(1, MICRO_TOKENS // max(1, seq_len)))
    batch = micro * math.ceil(items / micro)
    return Sizing(batch, micro, rows, train_item * batch, True)


class OutOfTime(Exception):  # noqa: N818 - a signal, not an error
    """A forward reached a block after its deadline (raised by `deadline`'s hooks)."""


class deadline:  # noqa: N801 - used as a context manager
    """Within it, a block of `model` starting its forward after clock() passes `at` raises
    OutOfTime; `entered` counts the blocks started (how far a cut-off forward came)."""

    def __init__(self, model: Any, clock: Callable[[], float], at: float) -> None:
        self.blocks, self.clock, self.at, self.entered = list(model.blocks), clock, at, 0

    def _check(self, *_: Any) -> None:
        if self.clock() > self.at:
            raise OutOfTime
        self.entered += 1

    def __enter__(self) -> deadline:
        self.handles = [b.register_forward_pre_hook(self._check) for b in self.blocks]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()


def _timed(clock: Callable[[], float], fn: Callable[[], Any]) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def fastest(
    clock: Callable[[], float],
    fn: Callable[[], Any],
    first: float,
    until: float,
    *,
    fits: float = float("inf"),
    confirm_until: float | None = None,
) -> float:
    """The least of `first` and more timed calls of `fn`: one, then more while `clock()` is before
    `until`, PROBE_TIMINGS timings in all; then, while the least is over `fits` (a cut the
    timings would make), more while `clock()` is before `confirm_until`."""
    best = min(first, _timed(clock, fn))
    for _ in range(PROBE_TIMINGS - 2):
        if clock() >= until:
            break
        best = min(best, _timed(clock, fn))
    while confirm_until is not None and best > fits and clock() < confirm_until:
        best = min(best, _timed(clock, fn))
    return best


def probe(
    s: Session, p: Placement, clock: Callable[[], float], budget: float
) -> tuple[float, float]:
    """(seconds per sequence in a training micro-step, seconds per sequence in a forward)."""
    obj, model = s.objective, p.model
    saved, rng = obj.state_dict(), torch.get_rng_state()
    batch = to_device(obj.draw(1), s.device)
    obj.load_state_dict(saved)

    def micro_step() -> None:
        with autocast(s.device, s.bf16):
            loss = obj.loss(model, batch)
        loss.backward()

    model.train()
    t0 = clock()
    try:
        with deadline(s.model, clock, t0 + PROBE_SHARE * budget) as cut:
            train = _timed(clock, micro_step)  # the first call also pays one-off costs
    except OutOfTime:  # a forward this slow: its share so far, scaled (a backward ~ 2 forwards)
        p.opt.zero_grad(set_to_none=True)
        torch.set_rng_state(rng)
        forward = (clock() - t0) * len(cut.blocks) / max(1, cut.entered)
        return 3 * forward, forward
    if train < PROBE_SHARE * budget:
        fits = MAX_STEP_SHARE * budget / max(1, s.cfg.batch_size)  # a sequence's most
        train = fastest(clock, micro_step, train, t0 + PROBE_REPEAT_SHARE * budget, fits=fits,
                        confirm_until=t0 + PROBE_CONFIRM_SHARE * budget)  # fmt: skip
    p.opt.zero_grad(set_to_none=True)
    with eval_mode(model), torch.no_grad(), autocast(s.device, s.bf16):
        forward = _timed(clock, lambda: obj.loss(model, batch))
    torch.set_rng_state(rng)
    return train, forward


def size_to_budget(
    s: Session,
    p: Placement,
    clock: Callable[[], float],
    elapsed: float,
    given: set[str],
    notify: Callable[[str], Any],
) -> Session:
    """`s` with its batch, evaluation size and warmup fitted to the time left of --max-time
    (`elapsed`: seconds already spent, by setup: the shares are of what is left); the choice
    printed and recorded."""
    cfg = s.cfg
    budget = max(float(cfg.max_time) - elapsed, 1e-3)  # the time setup left: shares of it
    seq = int(getattr(s.objective, "tokens_per_item", 1))
    n_eval = int(getattr(s.objective, "n_eval", cfg.eval_batches or 1))
    eval_bs = int(getattr(s.objective, "eval_batch_size", 1))
    t0 = clock()
    train, forward = probe(s, p, clock, budget)
    z = choose(budget, train, forward, batch_size=cfg.batch_size,
               micro_batch_size=cfg.micro_batch_size, seq_len=seq,
               eval_rows=n_eval * eval_bs)  # fmt: skip
    changes: dict[str, Any] = {"batch_size": z.batch_size, "micro_batch_size": z.micro_batch_size}
    new_eval_bs = min(z.batch_size, 16)  # the objectives' rule: the same windows on a resume
    changes["eval_batches"] = max(2 if new_eval_bs == 1 else 1, z.eval_rows // new_eval_bs)
    left = budget - (clock() - t0)
    steps = max(1, int(left * (1 - 3 * EVAL_SHARE) / max(z.step_seconds, 1e-9)))
    if "warmup" not in given and cfg.warmup is not None:
        changes["warmup"] = min(cfg.warmup, steps // 10)
    resize = getattr(s.objective, "resize_eval", None)
    if callable(resize):
        resize(changes["eval_batches"], new_eval_bs)
    else:
        changes.pop("eval_batches")
    accum = z.batch_size // z.micro_batch_size
    why = "measured" if z.probed else "the default batch fits"
    notify(
        f"lamina train: probe: one {seq}-token sequence took {train:.2f} s to train on, "
        f"{forward:.2f} s to evaluate; batch {z.batch_size} = micro-batch "
        f"{z.micro_batch_size} x {accum} accumulation ({why}), about {z.step_seconds:.1f} s a "
        f"step ({100 * z.step_seconds / budget:.1f}% of the {budget:.1f} s left after setup, "
        f"~{steps} steps); evaluations on {changes.get('eval_batches', n_eval) * new_eval_bs} held-out "
        f"sequences; warmup {changes.get('warmup', cfg.warmup)}"
    )
    rows = changes.get("eval_batches", n_eval) * new_eval_bs
    guess = {"step": z.step_seconds, "eval": rows * forward}
    sized = dataclasses.replace(s, cfg=cfg.replace(**changes), estimates=guess)
    if s.run is not None:
        record = s.run.read_train_config()
        record["train"] = sized.cfg.to_dict()
        s.run.write_train_config(record)
    return sized

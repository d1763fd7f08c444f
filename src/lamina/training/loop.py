"""The training loop: steps, evaluations and checkpoints over a Session.

    train_step(forward, task, opt, batch, accum, bf16, grad_clip, device) -> mean loss
        one optimizer step on a batch, in `accum` equal micro-batches; each micro-loss is
        divided by `accum` so the gradient is the batch mean; with a `no_sync` model (DDP)
        gradients are synchronised only on the last micro-step. A non-finite loss or gradient
        norm skips the optimizer step (the norm goes to `stats["grad_norm"]`).
    evaluate(forward, task, batches, bf16, device) -> {"loss": ..., ...}
    run_training(session, placement, ...) -> TrainResult
        the run, in steps a reader can follow: `_Run.plan` (how many steps, whether to stop),
        `_Run.step` (learning rate, batch slice, train_step, divergence checks), `_Run.log`,
        `_Run.evaluate` and `_Run.save` (each checks the weights first)

Per step the global batch (batch_size items) is drawn once from the objective, every process
takes its contiguous slice (the placement's rank of world_size), and splits that into micro-batches:
the data order does not depend on the number of processes. Only rank 0 writes and reports.

The learning rate follows `optim.schedule` over `total` steps; with a time budget `total` is
re-estimated every step (TimeBudget), so the decay ends at the budget. Evaluations and
checkpoints (`session.save_checkpoint`) come every eval_every / checkpoint_every steps, or, with
a time budget and no eval_every, at each fifth of the budget (a budget under LONG_BUDGET: at its
half only); the budget keeps back the last evaluation's and save's measured cost and
EXIT_RESERVE for the end, and a step or evaluation that runs long shows a line every few
seconds (`progress.Heartbeat`); with both a budget and max_steps,
whichever comes first ends the run. A non-finite loss or gradient norm stops the run before the
optimizer step; the weights are checked before every evaluation and checkpoint, and a
non-finite validation loss also stops it, so no checkpoint with NaN weights is ever written.
The error (NonFiniteLoss) names the last checkpoint that is good. SIGINT finishes the current
step, saves a checkpoint and returns with `stopped="interrupted"`.

Deliberately unaware of argument parsing and of what the model computes.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lamina.errors import LaminaError
from lamina.modes import eval_mode, non_finite
from lamina.pictures import loss_curves
from lamina.training.device import autocast, maybe_compile
from lamina.training.distributed import agree, global_mean
from lamina.training.objectives import Batch, Objective, slice_batch, to_device
from lamina.training.progress import Heartbeat, Progress
from lamina.training.schedule import TimeBudget, schedule
from lamina.training.session import Placement, Session, save_checkpoint, writer
from lamina.training.sizing import OutOfTime, deadline
from lamina.training.split_loss import val_line

EXIT_RESERVE = 1.0  # seconds (2% of a short budget) kept for what follows the last save
LONG_BUDGET = 300.0  # seconds: a budget this long evaluates at each fifth, a shorter one once


class NonFiniteLoss(LaminaError):
    """The loss became NaN or infinite; the message names the step and the last checkpoint."""


@dataclass
class TrainResult:
    step: int
    tokens: int
    stopped: str  # "done", "time" or "interrupted"
    losses: dict[int, float] = field(default_factory=dict)  # step -> training loss (this call)
    eval: dict[str, float] = field(default_factory=dict)  # the last evaluation
    seconds: float = 0.0


def train_step(
    forward: nn.Module,
    task: Objective,
    opt: torch.optim.Optimizer,
    batch: Batch,
    *,
    accum: int,
    bf16: bool = False,
    grad_clip: float = 0.0,
    device: torch.device | None = None,
    check_finite: bool = True,
    stats: dict[str, float] | None = None,
    on_micro: Any = None,
) -> float:
    """One optimizer step on `batch` split into `accum` micro-batches; returns the mean loss.

    With check_finite, a non-finite loss or gradient norm skips the step (gradients dropped);
    the gradient norm (before clipping) is written to `stats["grad_norm"]` when given;
    `on_micro(i)` is called before micro-step i.
    """
    device = device or torch.device("cpu")
    n = batch[0].shape[0]
    if n % accum:
        raise LaminaError(f"a batch of {n} does not split into {accum} equal micro-batches")
    micro = n // accum
    total = torch.zeros((), device=device)
    for i in range(accum):
        if on_micro is not None:
            on_micro(i)
        part = to_device(slice_batch(batch, i * micro, (i + 1) * micro), device)
        last = i == accum - 1
        sync = (
            contextlib.nullcontext()
            if last or not hasattr(forward, "no_sync")
            else forward.no_sync()
        )
        with sync:
            with autocast(device, bf16):
                loss = task.loss(forward, part)
            (loss / accum).backward()
        total += loss.detach()
    mean = float(global_mean(total)) / accum  # over all ranks: every rank decides alike
    if check_finite and not math.isfinite(mean):
        opt.zero_grad(set_to_none=True)
        return mean
    params = [p for g in opt.param_groups for p in g["params"]]
    if grad_clip > 0 or check_finite:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
        if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor
            norm = norm.full_tensor()
        grad_norm = float(norm)
        if stats is not None:
            stats["grad_norm"] = grad_norm
        if check_finite and not math.isfinite(grad_norm):
            opt.zero_grad(set_to_none=True)
            return mean
    opt.step()
    opt.zero_grad(set_to_none=True)
    return mean


def evaluate(
    forward: nn.Module, task: Objective, batches: list[Batch], *, bf16: bool, device: torch.device
) -> dict[str, float]:
    """Task metrics on fixed batches, in eval mode (no dropout), restoring the mode after."""
    with eval_mode(forward), torch.no_grad(), autocast(device, bf16):
        return task.evaluate(forward, [to_device(b, device) for b in batches])


class _StopFlag:
    """Turns the first SIGINT into a request to stop after the current step."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C is immediate

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class _Run:
    """One call of run_training: the session, its placement, and the loop's own bookkeeping."""

    def __init__(self, s: Session, p: Placement, prog: Progress, clock: Any, start: float):
        self.s, self.p, self.cfg, self.st = s, p, s.cfg, s.state
        self.prog, self.clock, self.start = prog, clock, start
        self.forward = maybe_compile(p.model, self.cfg.compile, prog.message)
        self.accum = self.cfg.accumulation(p.world_size)
        self.per_rank = self.cfg.batch_size // p.world_size
        c = self.cfg
        self.lr_for = schedule(c.lr, c.warmup, c.min_lr_ratio, c.decay, c.decay_fraction)
        self.budget: TimeBudget | None = None
        self.eval_times: list[float] = []  # for a time budget: evaluate at each fifth of it
        if c.max_time is not None:
            guess = s.estimates.get("step", 1.0)  # the probe's (training.sizing)
            self.budget = TimeBudget(
                max(c.max_time - self.st.seconds_used, 1e-3), first_guess=guess
            )
            self.budget.begin(start)
            if c.eval_every is None:  # at each fifth; in a short budget only at its half
                k = 5 if self.budget.seconds >= LONG_BUDGET else 2
                self.eval_times = [self.budget.seconds * i / k for i in range(1, k)]
        self.result = TrainResult(self.st.step, self.st.tokens, "done")
        self.last_eval = self.last_ckpt = -1
        self.good = self.st.step if self.st.step > 0 and s.run is not None else None  # resumed
        self.eval_cost, self.save_cost = s.estimates.get("eval", 0.0), 0.5
        self.steps, self.lr, self.last_took = 0, 0.0, 0.0  # steps, last lr, last step's s
        self.tick, self.tick_tokens = clock(), self.st.tokens  # for tokens/s

    # -- failure ------------------------------------------------------------------------------
    def diverged(self, what: str) -> NonFiniteLoss:
        self.prog.close()
        where = (
            f"step {self.good} in {self.s.run.path}"
            if self.good is not None and self.s.run is not None
            else "none (no checkpoint was written)"
        )
        return NonFiniteLoss(f"{what}; stopped. Last good checkpoint: {where}. Try a lower --lr")

    def check_weights(self) -> None:
        name = non_finite(self.p.model)
        _, bad = agree(0, name is not None)  # FSDP: each rank sees its shard
        if bad:
            raise self.diverged(
                f"the weights are not finite after step {self.st.step}"
                + (f" ({name})" if name else "")
            )

    # -- evaluation and checkpoints -------------------------------------------------------------
    def evaluate(self) -> None:
        s, st, t0 = self.s, self.st, self.clock()
        self.check_weights()
        with Heartbeat(self.prog, f"evaluating at step {st.step}"):
            res = evaluate(self.forward, s.objective, s.objective.eval_batches(), bf16=s.bf16,
                           device=s.device)  # fmt: skip
        self.result.eval, self.eval_cost, self.last_eval = res, self.clock() - t0, st.step
        bad = [k for k, v in res.items() if not math.isfinite(v)]
        if bad:
            raise self.diverged(f"validation {bad[0]} is {res[bad[0]]} at step {st.step}")
        st.metrics.append(
            {
                "step": st.step,
                **{f"val_{k}": v for k, v in res.items()},
                "elapsed": round(st.seconds_used + self.clock() - self.start, 3),
            }
        )
        line = val_line(res)
        self.prog.message(f"eval step {st.step}: {'val ' if 'nats/char' in line else ''}{line}")
        if writer(s, self.p):
            s.run.write_metrics(st.metrics)
            s.run.write_bytes(
                "loss.png", loss_curves([(s.run.path.name, st.metrics)], by_time=False)
            )
            for name, blob in getattr(s.objective, "eval_files", dict)().items():
                s.run.write_bytes(name, blob)  # e.g. confusion.png

    def save(self) -> None:
        t0 = self.clock()
        if self.last_eval != self.st.step:  # an evaluation at this step checked the weights
            self.check_weights()
        save_checkpoint(self.s, self.p, seconds_used=self.st.seconds_used + t0 - self.start)
        self.save_cost, self.last_ckpt = self.clock() - t0, self.st.step
        self.good = self.st.step

    # -- one pass of the loop -----------------------------------------------------------------
    def plan(self, requested: bool, stop_at: int | None) -> tuple[int, bool]:
        """(the run's total steps as now planned, whether to stop), agreed by all ranks."""
        cfg, st, budget = self.cfg, self.st, self.budget
        if budget is not None:
            exit_cost = min(EXIT_RESERVE, 0.02 * budget.seconds)
            budget.set_reserve(self.eval_cost + self.save_cost + exit_cost)
            total = budget.plan(self.steps, st.step, self.clock())
            if total <= st.step and self.steps and self.lr > cfg.lr * cfg.min_lr_ratio:
                total = st.step + 1  # the estimate fell short: one last step at the floor
            if cfg.max_steps is not None:  # both limits hold, whichever comes first
                total = min(total, cfg.max_steps)
            self.prog.set_total(total)
        else:
            total = cfg.max_steps
        stop = requested or (stop_at is not None and st.step >= stop_at)
        return agree(total, stop)  # all ranks end at the same step

    def step(self, total: int) -> float | None:
        """One optimizer step at the scheduled learning rate; the mean loss (None: dropped)."""
        s, st, p = self.s, self.st, self.p
        self.lr = self.lr_for(st.step, total)
        for g in p.opt.param_groups:
            g["lr"] = self.lr * g.get("lr_scale", 1.0)
        whole = s.objective.draw(self.cfg.batch_size)
        batch = slice_batch(whole, p.rank * self.per_rank, (p.rank + 1) * self.per_rank)
        stats: dict[str, float] = {}
        long = self.steps == 0 or self.last_took > 1.0  # a beat thread only for slow steps
        beat = Heartbeat(self.prog, f"step {st.step + 1}", self.accum, enabled=long)
        args = dict(accum=self.accum, bf16=s.bf16, grad_clip=self.cfg.grad_clip,
                    device=s.device, stats=stats, on_micro=beat.at)  # fmt: skip
        b = self.budget  # a step still running when the budget's steps must end is dropped
        cut = deadline(s.model, self.clock, b.start + b.seconds - b.reserve) if b and p.world_size == 1 else None  # fmt: skip
        try:
            with beat, cut or contextlib.nullcontext():
                loss = train_step(self.forward, s.objective, p.opt, batch, **args)
        except OutOfTime:
            p.opt.zero_grad(set_to_none=True)
            return None
        except Exception as exc:  # noqa: BLE001 - a compiled first step may fail any way
            if self.forward is p.model or self.steps > 0:
                raise
            self.prog.message(f"torch.compile failed ({type(exc).__name__}); running eagerly")
            self.forward = p.model
            p.opt.zero_grad(set_to_none=True)
            loss = train_step(self.forward, s.objective, p.opt, batch, **args)
        if not math.isfinite(loss):
            raise self.diverged(f"loss is {loss} at step {st.step + 1}")
        if not math.isfinite(stats.get("grad_norm", 0.0)):
            raise self.diverged(f"the gradient norm is {stats['grad_norm']} at step {st.step + 1}")
        st.step, self.steps = st.step + 1, self.steps + 1
        st.tokens += self.cfg.batch_size * s.objective.tokens_per_item
        self.result.losses[st.step] = loss
        return loss

    def log(self, loss: float, total: int, now: float) -> None:
        """A metrics record and a progress update, every log_every steps (and the first)."""
        st = self.st
        if st.step % self.cfg.log_every and st.step != 1:
            return
        rate = (st.tokens - self.tick_tokens) / max(now - self.tick, 1e-9)
        self.tick, self.tick_tokens = now, st.tokens
        st.metrics.append({"step": st.step, "loss": loss, "lr": self.lr, "tokens": st.tokens,
                           "tok_per_s": round(rate, 1),
                           "elapsed": round(st.seconds_used + now - self.start, 3)})  # fmt: skip
        if self.budget is not None:
            eta = self.budget.seconds - self.budget.elapsed(now)
        else:
            eta = (now - self.start) / self.steps * (total - st.step)
        self.prog.update(st.step, loss, self.lr, rate, eta)

    def after_step(self, now: float) -> None:
        """Evaluate and checkpoint when due."""
        cfg, step = self.cfg, self.st.step
        due_eval = bool(cfg.eval_every and step % cfg.eval_every == 0) or bool(
            self.eval_times and now - self.start >= self.eval_times[0]
        )
        if due_eval:
            self.evaluate()
            while self.eval_times and self.clock() - self.start >= self.eval_times[0]:
                self.eval_times.pop(0)
        every = cfg.checkpoint_every
        if (every and step % every == 0) or (every is None and due_eval):
            self.save()

    def stopped(self, total: int) -> str:
        """Why a run that reached `total` ended: by its time budget or its step count."""
        by_time = self.budget is not None and (
            self.cfg.max_steps is None or total < self.cfg.max_steps
        )
        return "time" if by_time else "done"


def run_training(
    s: Session,
    placement: Placement | None = None,
    *,
    quiet: bool = False,
    progress_stream: Any = None,
    stop_at: int | None = None,
    clock: Any = time.perf_counter,
    started_at: float | None = None,
) -> TrainResult:
    """Train `s` until max_steps, the time budget, SIGINT or `stop_at` (a simulated interrupt).

    placement: what trains in this process (`distributed.place`; None: one process, the
    session's own model). started_at: a `clock()` reading from before the session was built,
    so that setup time counts against a time budget (the command line passes its start time).
    In several processes, each trains on its slice and only rank 0 reports.
    """
    p = placement or Placement.alone(s)
    start = clock() if started_at is None else started_at
    prog = Progress(s.cfg.max_steps, quiet=quiet or p.rank != 0, every=s.cfg.log_every,
                    stream=progress_stream, initial=s.state.step)  # fmt: skip
    run = _Run(s, p, prog, clock, start)
    p.model.train()
    need = 2 * run.eval_cost + run.save_cost + (run.budget.first_guess if run.budget else 0)
    if s.state.step == 0 and (run.budget is None or run.budget.fits(clock(), need)):
        run.evaluate()  # zero-shot; skipped when it, a step and the last one cannot fit
    with _StopFlag() as flag:
        while True:
            total, stop = run.plan(flag.requested, stop_at)
            if s.state.step >= total:
                run.result.stopped = run.stopped(total)
                break
            if stop:
                run.result.stopped = "interrupted"
                break
            began = clock()
            loss = run.step(total)
            if loss is None:  # past the budget's deadline mid-step
                run.result.stopped = "time"
                break
            now = clock()
            run.last_took = now - began
            if run.budget is not None:
                run.budget.observe(run.steps, now, took=now - began)
            run.log(loss, total, now)
            run.after_step(now)
    if run.last_eval != s.state.step and (run.steps or run.budget is None):
        run.evaluate()
    if run.last_ckpt != s.state.step:
        run.save()
    prog.close()
    s.state.seconds_used += clock() - start
    run.result.step, run.result.tokens = s.state.step, s.state.tokens
    run.result.seconds = clock() - start
    return run.result

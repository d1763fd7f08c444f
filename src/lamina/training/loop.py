"""The training loop: steps, evaluations and checkpoints over a Session.

    train_step(forward, task, opt, batch, accum, bf16, grad_clip, device) -> mean loss
        one optimizer step on a batch, in `accum` equal micro-batches; each micro-loss is
        divided by `accum` so the gradient is the batch mean; with a `no_sync` model (DDP)
        gradients are synchronised only on the last micro-step. A non-finite loss or gradient
        norm skips the optimizer step (the norm goes to `stats["grad_norm"]`).
    evaluate(forward, task, batches, bf16, device) -> {"loss": ..., ...}
    run_training(session, ...) -> TrainResult

Per step the global batch (batch_size items) is drawn once from the task, every process takes
its contiguous slice (the session's rank of world_size), and splits that into micro-batches:
the data order does not depend on the number of processes. Only rank 0 writes and reports.

The learning rate follows `optim.schedule` over `total` steps; with a time budget `total` is
re-estimated every step (TimeBudget), so the decay ends at the budget. Evaluations and
checkpoints (`session.save_checkpoint`) come every eval_every / checkpoint_every steps, or, with
a time budget and no eval_every, at each fifth of the budget; with both a budget and max_steps,
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
from lamina.training.distributed import agree, global_mean
from lamina.training.optim import TimeBudget, schedule
from lamina.training.progress import Progress
from lamina.training.session import Session, save_checkpoint
from lamina.training.tasks import Batch, TrainTask, slice_batch, to_device, val_line


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


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def train_step(
    forward: nn.Module,
    task: TrainTask,
    opt: torch.optim.Optimizer,
    batch: Batch,
    *,
    accum: int,
    bf16: bool = False,
    grad_clip: float = 0.0,
    device: torch.device | None = None,
    check_finite: bool = True,
    stats: dict[str, float] | None = None,
) -> float:
    """One optimizer step on `batch` split into `accum` micro-batches; returns the mean loss.

    With check_finite, a non-finite loss or gradient norm skips the step (gradients dropped);
    the gradient norm (before clipping) is written to `stats["grad_norm"]` when given.
    """
    device = device or torch.device("cpu")
    n = batch[0].shape[0]
    if n % accum:
        raise LaminaError(f"a batch of {n} does not split into {accum} equal micro-batches")
    micro = n // accum
    total = torch.zeros((), device=device)
    for i in range(accum):
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
    forward: nn.Module, task: TrainTask, batches: list[Batch], *, bf16: bool, device: torch.device
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


def maybe_compile(model: nn.Module, enabled: bool, notify: Any) -> nn.Module:
    if not enabled:
        return model
    try:
        return torch.compile(model)
    except Exception as exc:  # noqa: BLE001 - any failure means "run eagerly"
        notify(f"torch.compile unavailable ({type(exc).__name__}: {exc}); running eagerly")
        return model


def _eval_now(s: Session, forward: nn.Module) -> dict[str, float]:
    return evaluate(forward, s.task, s.task.eval_batches(), bf16=s.bf16, device=s.device)


def run_training(
    s: Session,
    *,
    quiet: bool = False,
    progress_stream: Any = None,
    stop_at: int | None = None,
    clock: Any = time.perf_counter,
    started_at: float | None = None,
) -> TrainResult:
    """Train `s` until max_steps, the time budget, SIGINT or `stop_at` (a simulated interrupt).

    started_at: a `clock()` reading from before the session was built, so that setup time
    counts against a time budget (the command line passes its start time). In several
    processes (`distributed.prepare`), each trains on its slice and only rank 0 reports.
    """
    cfg, rank = s.cfg, s.rank
    accum = cfg.accumulation(s.world_size)
    per_rank = cfg.batch_size // s.world_size
    lr_for = schedule(cfg.lr, cfg.warmup, cfg.min_lr_ratio, cfg.decay, cfg.decay_fraction)
    start = clock() if started_at is None else started_at
    prog = Progress(
        cfg.max_steps,
        quiet=quiet or rank != 0,
        every=cfg.log_every,
        stream=progress_stream,
        initial=s.step,
    )
    forward = maybe_compile(s.model, cfg.compile, prog.message)
    budget = None
    if cfg.max_time is not None:
        budget = TimeBudget(max(cfg.max_time - s.seconds_used, 1e-3))
        budget.begin(start)
    eval_times: list[float] = []  # for a time budget: evaluate at each fifth of it
    if budget is not None and cfg.eval_every is None:
        eval_times = [budget.seconds * k / 5 for k in range(1, 5)]
    result = TrainResult(s.step, s.tokens, "done")
    last_eval = last_ckpt = -1
    good = s.step if s.step > 0 and s.run is not None else None  # resumed: its checkpoint
    eval_cost, save_cost = 0.0, 0.5

    def diverged(what: str) -> NonFiniteLoss:
        prog.close()
        where = (
            f"step {good} in {s.run.path}"
            if good is not None and s.run is not None
            else "none (no checkpoint was written)"
        )
        return NonFiniteLoss(f"{what}; stopped. Last good checkpoint: {where}. Try a lower --lr")

    def check_weights() -> None:
        name = non_finite(s.model)
        _, bad = agree(0, name is not None)  # FSDP: each rank sees its shard
        if bad:
            raise diverged(
                f"the weights are not finite after step {s.step}" + (f" ({name})" if name else "")
            )

    def do_eval() -> None:
        nonlocal last_eval, eval_cost
        t0 = clock()
        check_weights()
        result.eval = _eval_now(s, forward)
        eval_cost = clock() - t0
        last_eval = s.step
        bad = [k for k, v in result.eval.items() if not math.isfinite(v)]
        if bad:
            raise diverged(f"validation {bad[0]} is {result.eval[bad[0]]} at step {s.step}")
        rec = {
            "step": s.step,
            **{f"val_{k}": v for k, v in result.eval.items()},
            "elapsed": round(s.seconds_used + clock() - start, 3),
        }
        s.metrics.append(rec)
        line = val_line(result.eval)
        prog.message(f"eval step {s.step}: {'val ' if 'nats/char' in line else ''}{line}")
        if s.writer:
            s.run.write_metrics(s.metrics)
            s.run.write_bytes(
                "loss.png", loss_curves([(s.run.path.name, s.metrics)], by_time=False)
            )
            for name, blob in getattr(s.task, "eval_files", dict)().items():  # e.g. confusion.png
                s.run.write_bytes(name, blob)

    def do_save() -> None:
        nonlocal last_ckpt, save_cost, good
        t0 = clock()
        if last_eval != s.step:  # an evaluation at this step has checked the weights already
            check_weights()
        save_checkpoint(s, seconds_used=s.seconds_used + t0 - start)
        save_cost, last_ckpt = clock() - t0, s.step
        good = s.step

    s.model.train()
    if s.step == 0:
        do_eval()
    steps_this_call, tick, tick_tokens, lr = 0, clock(), s.tokens, 0.0
    with _StopFlag() as flag:
        while True:
            if budget is not None:
                budget.set_reserve(eval_cost + save_cost + 0.1)
                total = budget.plan(steps_this_call, s.step, clock())
                if total <= s.step and steps_this_call and lr > cfg.lr * cfg.min_lr_ratio:
                    total = s.step + 1  # the estimate fell short: one last step at the floor
                if cfg.max_steps is not None:  # both limits hold, whichever comes first
                    total = min(total, cfg.max_steps)
                prog.set_total(total)
            else:
                total = cfg.max_steps
            stop = flag.requested or (stop_at is not None and s.step >= stop_at)
            total, stop = agree(total, stop)  # all ranks end at the same step
            if s.step >= total:
                by_time = budget is not None and (cfg.max_steps is None or total < cfg.max_steps)
                result.stopped = "time" if by_time else "done"
                break
            if stop:
                result.stopped = "interrupted"
                break
            lr = lr_for(s.step, total)
            for g in s.opt.param_groups:
                g["lr"] = lr * g.get("lr_scale", 1.0)
            batch = slice_batch(s.task.draw(cfg.batch_size), rank * per_rank, (rank + 1) * per_rank)
            stats: dict[str, float] = {}
            step_args = dict(
                accum=accum, bf16=s.bf16, grad_clip=cfg.grad_clip, device=s.device, stats=stats
            )
            try:
                loss = train_step(forward, s.task, s.opt, batch, **step_args)
            except Exception as exc:  # noqa: BLE001 - a compiled first step may fail any way
                if forward is s.model or steps_this_call > 0:
                    raise
                prog.message(f"torch.compile failed ({type(exc).__name__}); running eagerly")
                forward = s.model
                s.opt.zero_grad(set_to_none=True)
                loss = train_step(forward, s.task, s.opt, batch, **step_args)
            if not math.isfinite(loss):
                raise diverged(f"loss is {loss} at step {s.step + 1}")
            if not math.isfinite(stats.get("grad_norm", 0.0)):
                raise diverged(f"the gradient norm is {stats['grad_norm']} at step {s.step + 1}")
            s.step += 1
            steps_this_call += 1
            s.tokens += cfg.batch_size * s.task.tokens_per_item
            result.losses[s.step] = loss
            now = clock()
            if budget is not None:
                budget.observe(steps_this_call, now)
            if s.step % cfg.log_every == 0 or s.step == 1:
                rate = (s.tokens - tick_tokens) / max(now - tick, 1e-9)
                tick, tick_tokens = now, s.tokens
                s.metrics.append(
                    {
                        "step": s.step,
                        "loss": loss,
                        "lr": lr,
                        "tokens": s.tokens,
                        "tok_per_s": round(rate, 1),
                        "elapsed": round(s.seconds_used + now - start, 3),
                    }
                )
                if budget is not None:
                    eta = budget.seconds - budget.elapsed(now)
                else:
                    eta = (now - start) / steps_this_call * (total - s.step)
                prog.update(s.step, loss, lr, rate, eta)
            due_eval = (cfg.eval_every and s.step % cfg.eval_every == 0) or (
                eval_times and now - start >= eval_times[0]
            )
            if due_eval:
                do_eval()
                while eval_times and clock() - start >= eval_times[0]:
                    eval_times.pop(0)
            every = cfg.checkpoint_every
            if (every and s.step % every == 0) or (every is None and due_eval):
                do_save()
    if last_eval != s.step:
        do_eval()
    if last_ckpt != s.step:
        do_save()
    prog.close()
    s.seconds_used += clock() - start
    result.step, result.tokens, result.seconds = s.step, s.tokens, clock() - start
    return result

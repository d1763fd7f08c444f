"""Optimization: AdamW with decay on matrices only, its pickle-free state, and the lr schedule.

    param_groups(model, weight_decay) -> [{"params": >= 2-D weights, "weight_decay": wd},
                                          {"params": biases, norms (1-D), "weight_decay": 0}]
    Parameters come from `model.parameters()`, which yields a shared (tied) tensor once, so the
    token table that is also the LM head is decayed, and stepped, exactly once.

    build_optimizer(model, lr, weight_decay, betas) -> torch.optim.AdamW (fused where the
    installed torch supports it for the parameters' device, else the foreach/for-loop one).

    optimizer_tensors(opt) -> (tensors, meta): per-parameter state as named tensors
    ("state.<i>.<name>") and the JSON-able rest (hyperparameters of each group, which state
    entries are tensors). `load_optimizer_tensors(opt, tensors, meta)` inverts it.

    schedule(peak, warmup, floor_ratio, kind) -> lr(step, total)      checked once, then pure
    lr_at(step, total, peak, warmup, floor_ratio, kind) -> float       the same, in one call
        step 0 .. warmup-1: linear warmup, peak * (step + 1) / (warmup + 1)   (never 0)
        then cosine or linear decay from peak, reaching peak * floor_ratio exactly at
        step total - 1 (the last optimizer step is fully decayed), and staying there.

    TimeBudget(seconds): given the steps done and the clock, how many steps fit in the rest of
    the budget? Seconds per step are measured after a few warm-up steps (compilation and
    first-call costs excluded) as a running average over every step since, so periodic
    evaluations and checkpoints are amortised; a reserve for the final evaluation and save is
    kept back. `plan(step, now)` returns the estimated total step count (re-estimated at
    every step), or `step` itself when no further step fits: the caller stops there.

Deliberately unaware of data, models beyond their parameters, and files.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from lamina.errors import LaminaError


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: decayed (dim >= 2) and not decayed (dim < 2); each tensor appears once."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.99),
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """AdamW over `param_groups`; fused=None tries the fused kernel and falls back quietly."""
    groups = param_groups(model, weight_decay)
    if fused is not False:
        try:
            return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
        except (RuntimeError, TypeError, ValueError):
            if fused:
                raise
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Split `opt.state_dict()` into safetensors-ready tensors and JSON-able metadata."""
    sd = opt.state_dict()
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, state in sd["state"].items():
        for name, value in state.items():
            if isinstance(value, Tensor):
                tensors[f"state.{index}.{name}"] = value.detach().to("cpu").contiguous().clone()
            else:
                scalars.setdefault(str(index), {})[name] = value
    groups = []
    for g in sd["param_groups"]:
        groups.append({k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()})
    return tensors, {"param_groups": groups, "scalars": scalars}


def load_optimizer_tensors(
    opt: torch.optim.Optimizer, tensors: dict[str, Tensor], meta: dict[str, Any]
) -> None:
    """Restore what `optimizer_tensors` wrote; a mismatch in shape or count is a LaminaError."""
    if not isinstance(meta, dict) or "param_groups" not in meta:
        raise LaminaError("optimizer metadata has no 'param_groups'")
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        parts = key.split(".")
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit():
            raise LaminaError(f"unexpected optimizer tensor {key!r}")
        state.setdefault(int(parts[1]), {})[parts[2]] = value
    for index, extra in meta.get("scalars", {}).items():
        state.setdefault(int(index), {}).update(extra)
    groups = []
    for g in meta["param_groups"]:
        groups.append({k: (tuple(v) if k == "betas" else v) for k, v in g.items()})
    current = opt.state_dict()["param_groups"]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in current]:
        raise LaminaError("saved optimizer state does not match the model's parameter groups")
    params = [p for g in opt.param_groups for p in g["params"]]
    for index, st in state.items():
        if index >= len(params):
            raise LaminaError(f"optimizer state for parameter {index}, the model has {len(params)}")
        for name in ("exp_avg", "exp_avg_sq"):
            if name in st and tuple(st[name].shape) != tuple(params[index].shape):
                raise LaminaError(
                    f"optimizer state {name} of parameter {index} has shape "
                    f"{tuple(st[name].shape)}, the parameter {tuple(params[index].shape)}"
                )
    try:
        opt.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, RuntimeError) as exc:
        raise LaminaError(f"cannot restore the optimizer state: {exc}") from exc


# -- the learning-rate schedule ------------------------------------------------------------
def schedule(
    peak: float, warmup: int = 0, floor_ratio: float = 0.1, kind: str = "cosine"
) -> Callable[[int, int], float]:
    """`lr(step, total)` for optimizer step `step` (0-based) of a run of `total` steps."""
    if kind not in ("cosine", "linear"):
        raise LaminaError(f"decay must be 'cosine' or 'linear', got {kind!r}")
    floor, cosine = peak * floor_ratio, kind == "cosine"

    def lr(step: int, total: int) -> float:
        if step < warmup:
            return peak * (step + 1) / (warmup + 1)
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
) -> float:
    """Learning rate for optimizer step `step` (0-based) of a run of `total` steps."""
    return schedule(peak, warmup, floor_ratio, kind)(step, total)


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

    def observe(self, steps_done: int, now: float) -> None:
        """Call after each step with the number of steps done in this budget and the clock."""
        if self.start is None:
            raise LaminaError("TimeBudget.begin() must be called first")
        if steps_done == 1:
            self._first_step = now - self.start
        if steps_done == self.settle and self._mark is None:
            self._mark = (steps_done, now)

    def plan(self, steps_done: int, step: int, now: float) -> int:
        """Estimated total steps of the run (`step` = global steps so far; `step` = stop now)."""
        if self.start is None:
            raise LaminaError("TimeBudget.begin() must be called first")
        left = self.seconds - (now - self.start) - self.reserve
        rate = max(self.seconds_per_step(steps_done, now), 1e-6)
        more = int(left // rate)
        return step + max(0, more)

    def elapsed(self, now: float) -> float:
        return 0.0 if self.start is None else now - self.start

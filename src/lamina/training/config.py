"""Training configuration: one validated dataclass, JSON round trip, duration parsing.

`TrainConfig` holds everything about *how* to train (data, batch, schedule, precision, output);
the model's shape lives in the model config (`GPTConfig` / `EncoderConfig`) and is saved beside
it. Fields left as None are resolved at run start (`lamina.training.defaults`), and the resolved
values are what gets recorded, so a run directory always says exactly what ran.

Deliberately unaware of models, tensors and files.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from lamina.errors import LaminaError

TaskName = Literal["lm", "first-last"]
DeviceName = Literal["auto", "cpu", "cuda", "mps"]
DtypeName = Literal["auto", "fp32", "bf16"]
DecayKind = Literal["cosine", "linear"]

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


def _pos_int(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LaminaError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise LaminaError(f"{name} must be one of {', '.join(options)}, got {value!r}")


@dataclass
class TrainConfig:
    """How to train. None means "choose for me" (resolved before the run starts)."""

    task: TaskName = "lm"  # "lm": next-token prediction on a corpus; "first-last": toy classifier
    data: str | None = None  # file or folder of .txt; None: the built-in Shakespeare corpus
    tokenizer: str = "char"  # a spec for lamina.data.spec.build_tokenizer
    preset: str | None = None  # model preset; None: chosen from data size and budget
    model_overrides: dict[str, Any] = field(default_factory=dict)  # GPTConfig fields
    out: str | None = None  # run directory; None: runs/<timestamp>
    max_steps: int | None = None  # optimizer steps; None with no max_time: preset default
    max_time: float | None = None  # wall-clock budget in seconds (schedule laid over it)
    batch_size: int | None = None  # sequences per optimizer step, all processes together
    micro_batch_size: int | None = None  # sequences per process per micro-step
    lr: float | None = None  # peak learning rate
    min_lr_ratio: float | None = None  # the decay's floor as a fraction of lr (lm: 0.1)
    warmup: int | None = None  # linear warmup steps
    decay: DecayKind | None = None  # shape of the decay after warmup (lm: cosine)
    weight_decay: float | None = None  # AdamW decay on >= 2-D weights only (lm: 0.1)
    beta1: float = 0.9
    beta2: float | None = None  # (lm: 0.99)
    grad_clip: float | None = None  # max global gradient norm; 0 disables (lm: 1.0)
    eval_every: int | None = None  # steps between evaluations; None: about 10 per run
    eval_batches: int = 20  # fixed held-out batches per evaluation
    checkpoint_every: int | None = None  # steps between checkpoints; None: at each evaluation
    log_every: int = 10  # steps between progress lines when not on a terminal
    seed: int | None = None  # (lm: 1337; first-last: 7, the seed encoder's)
    device: DeviceName = "auto"
    dtype: DtypeName = "auto"  # auto: bf16 autocast only where measured faster
    compile: bool = False  # torch.compile the model (falls back to eager if it fails)
    val_fraction: float = 0.1  # the tail of the corpus held out (nanoGPT uses 10%)

    def __post_init__(self) -> None:
        _choice("task", self.task, ("lm", "first-last"))
        _choice("device", self.device, ("auto", "cpu", "cuda", "mps"))
        _choice("dtype", self.dtype, ("auto", "fp32", "bf16"))
        if self.decay is not None:
            _choice("decay", self.decay, ("cosine", "linear"))
        for name in ("max_steps", "batch_size", "micro_batch_size", "eval_every"):
            if getattr(self, name) is not None:
                _pos_int(name, getattr(self, name))
        if self.checkpoint_every is not None:
            _pos_int("checkpoint_every", self.checkpoint_every)
        if self.warmup is not None:
            _pos_int("warmup", self.warmup, 0)
        _pos_int("eval_batches", self.eval_batches)
        _pos_int("log_every", self.log_every)
        if self.seed is not None:
            _pos_int("seed", self.seed, 0)
        if self.max_time is not None:
            self.max_time = parse_duration(self.max_time)
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise LaminaError(f"lr must be a positive number, got {self.lr!r}")
        for name in ("min_lr_ratio", "val_fraction", "beta1", "beta2"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v < 1.0:
                raise LaminaError(f"{name} must be in [0, 1), got {v!r}")
        for name in ("weight_decay", "grad_clip"):
            if getattr(self, name) is not None and not getattr(self, name) >= 0:
                raise LaminaError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.batch_size is not None and self.micro_batch_size is not None:
            if self.batch_size % self.micro_batch_size:
                raise LaminaError(
                    f"batch_size {self.batch_size} is not divisible by micro_batch_size "
                    f"{self.micro_batch_size}"
                )
        if not isinstance(self.model_overrides, dict):
            raise LaminaError("model_overrides must be a dict of model config fields")

    def accumulation(self, world_size: int = 1) -> int:
        """Micro-steps per optimizer step: batch / (micro-batch * processes)."""
        per_step = (self.micro_batch_size or 1) * world_size
        if (self.batch_size or 1) % per_step:
            raise LaminaError(
                f"batch_size {self.batch_size} is not divisible by micro_batch_size "
                f"{self.micro_batch_size} x {world_size} processes"
            )
        return (self.batch_size or 1) // per_step

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        if not isinstance(data, dict):
            raise LaminaError("a training config must be a JSON object")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise LaminaError(f"unknown training config field(s): {', '.join(unknown)}")
        return cls(**data)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

"""Training configuration: a frozen, validated `TrainConfig`, its defaults table, durations.

    TrainConfig(...)                       how to train (data, batch, schedule, precision, output);
                                           validated when built; JSON round trip
    DEFAULTS                               what None means for each field, in one table
    resolve_defaults(cfg, device) -> TrainConfig   every None a run needs, filled from DEFAULTS
    default_text(name) -> str              a field's default in words (`lamina train --help`)
    parse_duration("5m") -> 300.0          the command line's --max-time

The model's shape lives in the model config (`GPTConfig` / `EncoderConfig`) and is saved beside
this one. Fields left as None are resolved at run start for the task and device ("situation":
a language model on a CPU, on a CUDA GPU, or the first-last task), and the resolved values are
what gets recorded, so a run directory always says exactly what ran. The CPU choices (char-cpu
with 3 layers and no dropout, Muon for the blocks' matrices with AdamW for the rest, batch 48,
lr 1e-2, cosine to 0.1) won 120-second runs on tinyshakespeare on 2 cores against every other
variant tried; the measurements are in BENCHMARKS.md ("Speedrun").

Deliberately unaware of models, tensors, devices beyond their type name, and files.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from lamina.errors import LaminaError
from lamina.quant import native_bf16
from lamina.validate import (
    boolean,
    choice,
    fraction,
    non_negative_int,
    non_negative_number,
    positive_int,
    positive_number,
)

TaskName = Literal["lm", "first-last", "classify"]
PoolingName = Literal["mean", "first", "last"]
ClassWeights = Literal["none", "balanced"]
DeviceName = Literal["auto", "cpu", "cuda", "mps"]
DtypeName = Literal["auto", "fp32", "bf16"]
DecayKind = Literal["cosine", "linear", "wsd"]
OptimizerName = Literal["adamw", "muon"]
NSDtype = Literal["fp32", "bf16"]
Situation = Literal["cpu", "gpu", "first-last"]

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


@dataclass(frozen=True)
class TrainConfig:
    """How to train. None means "choose for me": see DEFAULTS (resolved before the run starts)."""

    task: TaskName = "lm"  # "lm": next-token prediction on a corpus; "first-last": toy classifier
    data: str | None = None  # file or folder of .txt files
    tokenizer: str = "char"  # a spec for lamina.data.spec.build_tokenizer
    preset: str | None = None  # the GPT preset the model starts from
    model_overrides: dict[str, Any] = field(default_factory=dict)  # model config fields
    out: str | None = None  # run directory (recorded; chosen by the caller)
    max_steps: int | None = None  # optimizer steps
    max_time: float | None = None  # wall-clock budget in seconds (schedule laid over it)
    batch_size: int | None = None  # sequences per optimizer step, all processes together
    micro_batch_size: int | None = None  # sequences per process per micro-step
    lr: float | None = None  # peak learning rate
    min_lr_ratio: float | None = None  # the decay's floor as a fraction of lr
    warmup: int | None = None  # linear warmup steps
    decay: DecayKind | None = None  # shape of the decay after warmup
    decay_fraction: float | None = None  # wsd: the share of the steps spent decaying
    weight_decay: float | None = None  # AdamW decay on >= 2-D weights only
    optimizer: OptimizerName | None = None  # adamw, or muon for the blocks' matrices
    muon_ns_dtype: NSDtype | None = None  # muon: the Newton-Schulz iteration's precision
    embed_lr_scale: float | None = None  # the embedding tables' lr, as a multiple of lr
    head_lr_scale: float | None = None  # an untied head's lr, as a multiple of lr
    beta1: float = 0.9
    beta2: float | None = None
    grad_clip: float | None = None  # max global gradient norm; 0 disables
    eval_every: int | None = None  # steps between evaluations
    eval_batches: int = 20  # fixed held-out batches per evaluation
    checkpoint_every: int | None = None  # steps between checkpoints
    log_every: int = 10  # steps between progress lines when not on a terminal
    seed: int | None = None
    device: DeviceName = "auto"
    dtype: DtypeName = "auto"  # auto: bf16 autocast only where measured faster
    compile: bool = False  # torch.compile the model (falls back to eager if it fails)
    val_fraction: float = 0.1  # the tail of the corpus held out (nanoGPT uses 10%)
    init_from: str | None = None  # a model/run/HF folder whose weights and tokenizer start the run
    # --task classify (lamina.training.classify): labelled texts in, an encoder classifier out
    val_data: str | None = None  # validation texts; None: a stratified val_fraction of data
    text_column: str = "text"  # CSV/TSV column or JSONL field holding the text
    label_column: str = "label"  # ... and the label
    max_len: int = 256  # tokens per text, the classification token included; longer are cut
    pooling: PoolingName = "mean"  # mean of real tokens, the first ([CLS]) or the last real one
    class_weights: ClassWeights = "none"  # balanced: weigh texts by n / (K * n_label)
    bucket: bool = False  # draw each batch from texts of similar length (less padding)

    def __post_init__(self) -> None:
        choice("task", self.task, ("lm", "first-last", "classify"))
        choice("pooling", self.pooling, ("mean", "first", "last"))
        choice("class_weights", self.class_weights, ("none", "balanced"))
        boolean("bucket", self.bucket)
        if isinstance(self.max_len, bool) or not isinstance(self.max_len, int) or self.max_len < 2:
            raise LaminaError(f"max_len must be an integer >= 2, got {self.max_len!r}")
        for name in ("text_column", "label_column"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise LaminaError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        choice("device", self.device, ("auto", "cpu", "cuda", "mps"))
        choice("dtype", self.dtype, ("auto", "fp32", "bf16"))
        boolean("compile", self.compile)
        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        given = {k: v for k, v in given.items() if v is not None}
        for name in ("max_steps", "batch_size", "micro_batch_size", "eval_every",
                     "eval_batches", "checkpoint_every", "log_every"):  # fmt: skip
            if name in given:
                positive_int(name, given[name])
        for name in ("warmup", "seed"):
            if name in given:
                non_negative_int(name, given[name])
        if "seed" in given and given["seed"] >= 2**64:  # torch seeds are 64-bit
            raise LaminaError(f"seed must be in [0, 2**64), got {given['seed']}")
        if "decay" in given:
            choice("decay", self.decay, ("cosine", "linear", "wsd"))
        if "optimizer" in given:
            choice("optimizer", self.optimizer, ("adamw", "muon"))
        if "muon_ns_dtype" in given:
            choice("muon_ns_dtype", self.muon_ns_dtype, ("fp32", "bf16"))
        if "decay_fraction" in given:
            f = given["decay_fraction"]
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
                raise LaminaError(
                    f"decay_fraction must be in (0, 1], got {given['decay_fraction']!r}"
                )
        if isinstance(self.max_time, str):
            raise LaminaError(
                f"max_time is in seconds, got {self.max_time!r}; parse_duration reads '5m' etc."
            )
        for name in ("max_time", "lr", "embed_lr_scale", "head_lr_scale"):
            if name in given:
                positive_number(name, given[name])
        for name in ("min_lr_ratio", "val_fraction", "beta1", "beta2"):
            if name in given:
                fraction(name, given[name])
        for name in ("weight_decay", "grad_clip"):
            if name in given:
                non_negative_number(name, given[name])
        if self.batch_size is not None and self.micro_batch_size is not None:
            if self.batch_size % self.micro_batch_size:
                raise LaminaError(
                    f"batch_size {self.batch_size} is not divisible by micro_batch_size "
                    f"{self.micro_batch_size}"
                )
        if self.init_from is not None and self.preset is not None:
            raise LaminaError("--preset and --init-from both name the model; give one")
        if self.init_from is not None and self.task != "lm":
            raise LaminaError("--init-from fine-tunes a language model (--task lm)")
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


# -- defaults -----------------------------------------------------------------------------------
def _words(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True)
class Default:
    """What None means for one field: a value per situation, or a rule over earlier fields.

    `rule` computes the value from the fields resolved before it in DEFAULTS; `text` says the
    rule in words (or, without a rule, what None keeps meaning); `unless` names a field whose
    being set keeps this one None; `note` is added to the generated description.
    """

    cpu: Any = None  # a language model on a CPU (or an Apple GPU)
    gpu: Any = None  # a language model on a CUDA GPU
    first_last: Any = None  # the encoder classifier's first-last task
    finetune: Any = None  # with --init-from, in any situation (None: as without it)
    rule: Callable[[dict[str, Any]], Any] | None = None
    text: str = ""
    unless: str | None = None
    note: str = ""

    def value(self, where: Situation, fields: dict[str, Any]) -> Any:
        if self.unless is not None and fields[self.unless] is not None:
            return None
        if self.finetune is not None and fields.get("init_from") is not None:
            return self.finetune
        if self.rule is not None:
            return self.rule(fields)
        return {"cpu": self.cpu, "gpu": self.gpu, "first-last": self.first_last}[where]

    def describe(self) -> str:
        if self.text:
            return self.text
        cpu, gpu, fl = self.cpu, self.gpu, self.first_last
        if cpu == gpu:
            out = _words(cpu)
            if fl is not None and fl != cpu:
                out += f"; {_words(fl)} for first-last"
        elif fl == gpu:
            out = f"{_words(cpu)} on a CPU, {_words(gpu)} on a GPU and for first-last"
        else:
            out = f"{_words(cpu)} on a CPU, {_words(gpu)} on a GPU"
            if fl is not None:
                out += f"; {_words(fl)} for first-last"
        if self.unless is not None:
            out += f"; none with --{self.unless.replace('_', '-')}"
        if self.finetune is not None:
            out += f"; {_words(self.finetune)} with --init-from"
        return out + self.note


# the model shape when the preset is chosen for you on a CPU: more steps in a short budget beat
# a fourth layer, and dropout only slows a run of minutes (see the module docstring)
CPU_SHAPE: dict[str, Any] = {"n_layers": 3, "dropout": 0.0}
# Muon's Newton-Schulz steps in bf16 ran 2x faster than fp32 on a CPU with AVX512-BF16; where
# bf16 is emulated (AVX2-only CPUs) they would be many times slower
NS_DTYPE_CPU = "bf16" if native_bf16() else "fp32"

# --init-from: a pretrained model needs a gentler peak and little warmup (BENCHMARKS.md,
# "Fine-tuning": a char-cpu model fine-tuned on new text for 100 steps on a CPU)
FINETUNE_LR = 1e-3
FINETUNE_WARMUP = 10

# field -> what None means. Order matters: a rule sees the fields resolved above it.
DEFAULTS: dict[str, Default] = {
    "data": Default(text="Shakespeare's complete works, built in"),
    "preset": Default(
        "char-cpu",
        "baby",
        unless="init_from",
        note="; on a CPU also " + ", ".join(f"{k} {_words(v)}" for k, v in CPU_SHAPE.items()),
    ),
    "max_steps": Default(2000, 2000, 300, unless="max_time"),
    "batch_size": Default(48, 64, 64),
    "micro_batch_size": Default(rule=lambda f: f["batch_size"], text="the batch size"),
    "lr": Default(1e-2, 1e-3, 2e-3, finetune=FINETUNE_LR),
    "min_lr_ratio": Default(0.1, 0.1, 0.05),
    "warmup": Default(
        finetune=FINETUNE_WARMUP,
        rule=lambda f: min(100, f["max_steps"] // 10) if f["max_steps"] else 20,
        text="100, or a tenth of the steps if that is fewer; 20 with --max-time; "
        f"{FINETUNE_WARMUP} with --init-from",
    ),
    "decay": Default("cosine", "cosine", "linear"),
    "decay_fraction": Default(0.2, 0.2, 0.2),
    "weight_decay": Default(0.1, 0.1, 0.01),
    "optimizer": Default("muon", "adamw", "adamw", finetune="adamw"),
    "muon_ns_dtype": Default(
        NS_DTYPE_CPU,
        "bf16",
        NS_DTYPE_CPU,
        text="bf16 on a GPU and where the CPU has AVX512-BF16 or AMX (measured 2x faster "
        "there), else fp32 (bf16 is emulated there)",
    ),
    "embed_lr_scale": Default(1.0, 1.0, 1.0),
    "head_lr_scale": Default(1.0, 1.0, 1.0, note="; ignored with a tied head"),
    "beta2": Default(0.99, 0.99, 0.999),
    "grad_clip": Default(1.0, 1.0, 0.0),
    "eval_every": Default(
        rule=lambda f: max(1, f["max_steps"] // 10) if f["max_steps"] else None,
        text="a tenth of the steps; with --max-time, at each fifth of the budget",
    ),
    "checkpoint_every": Default(text="at each evaluation"),
    "seed": Default(1337, 1337, 7),
}


# what a run recorded before these fields existed ran with (a resume fills them from here, not
# from DEFAULTS, whose values may change)
BEFORE_RECORDED: dict[str, Any] = {
    "optimizer": "adamw",
    "embed_lr_scale": 1.0,
    "head_lr_scale": 1.0,
    "decay_fraction": 0.2,
}


def situation(task: str, device: str) -> Situation:
    """Which column of DEFAULTS applies: "first-last" (also for classify: both train the encoder
    classifier), or a language model on "gpu" / "cpu"."""
    if task in ("first-last", "classify"):
        return "first-last"
    return "gpu" if device == "cuda" else "cpu"


def resolve_defaults(cfg: TrainConfig, device: str) -> TrainConfig:
    """`cfg` with every None in DEFAULTS filled for its task and `device` ("cpu", "cuda", ...)."""
    where = situation(cfg.task, device)
    fields = cfg.to_dict()
    for name, default in DEFAULTS.items():
        if fields[name] is None:
            fields[name] = default.value(where, fields)
    if where == "cpu" and cfg.preset is None and cfg.init_from is None:
        fields["model_overrides"] = {**CPU_SHAPE, **cfg.model_overrides}
    return TrainConfig(**fields)


def default_text(name: str) -> str:
    """A field's default in words: from DEFAULTS, else the dataclass's own default."""
    if name in DEFAULTS:
        return DEFAULTS[name].describe()
    f = next((f for f in dataclasses.fields(TrainConfig) if f.name == name), None)
    if f is None or f.default is dataclasses.MISSING:
        raise LaminaError(f"TrainConfig has no field {name!r} with a default")
    return _words(f.default)

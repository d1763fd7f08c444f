"""What a config field says about itself, and what None means for it.

    option(default, help, none=Default(...), **argparse keywords) -> a dataclass field carrying
        its help (for `lamina train --help` and the README's list), what None resolves to and
        its flag's extras, so each is written once, beside the field
    Default(cpu, gpu, first_last, finetune, rule, text, unless, note)   what None means per
        situation (a language model on a CPU or on a CUDA GPU, or the encoder classifier's
        tasks), or a rule over the fields above it; describe() says it in words
    words(value) -> "none" / "on" / "0.001"
    CPU_SHAPE, NS_DTYPE_CPU, FINETUNE_LR, FINETUNE_WARMUP   measured choices the table uses
    BEFORE_RECORDED      what a run recorded before a field existed ran with

Deliberately unaware of which fields exist (config.py) and of which tasks exist (registry.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from lamina.cpu import native_bf16

Situation = Literal["cpu", "gpu", "first-last"]


def words(value: Any) -> str:
    """A default in words: none, on/off, 0.001, 48."""
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

    `rule` computes the value from the fields resolved before it (field order); `text` says the
    rule in words (or, without a rule, what None keeps meaning); `unless` names a field whose
    being set keeps this one None; `note` is added to the generated description.
    """

    cpu: Any = None  # a language model on a CPU (or an Apple GPU)
    gpu: Any = None  # a language model on a CUDA GPU
    first_last: Any = None  # the encoder classifier's tasks (first-last, classify)
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
            out = words(cpu)
            if fl is not None and fl != cpu:
                out += f"; {words(fl)} for first-last"
        elif fl == gpu:
            out = f"{words(cpu)} on a CPU, {words(gpu)} on a GPU and for first-last"
        else:
            out = f"{words(cpu)} on a CPU, {words(gpu)} on a GPU"
            if fl is not None:
                out += f"; {words(fl)} for first-last"
        if self.unless is not None:
            out += f"; none with --{self.unless.replace('_', '-')}"
        if self.finetune is not None:
            out += f"; {words(self.finetune)} with --init-from"
        return out + self.note


def option(
    default: Any = None,
    help: str = "",  # noqa: A002 - argparse's word
    *,
    none: Default | None = None,
    factory: Callable[[], Any] | None = None,
    flag: bool = True,
    **argparse_keywords: Any,
) -> Any:
    """A config field with everything said about it in one place: its help (for --help, the
    README's list), `none` (what None resolves to, for DEFAULTS) and extra argparse keywords
    (type and choices come from the annotation; flag=False: no command-line flag)."""
    meta = {"help": help, "none": none, "flag": argparse_keywords if flag else None}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# the model shape when the preset is chosen for you on a CPU: more steps in a short budget beat
# a fourth layer, and dropout only slows a run of minutes (see the module docstring)
CPU_SHAPE: dict[str, Any] = {"n_layers": 3, "dropout": 0.0}
# Muon's Newton-Schulz steps in bf16 ran faster than fp32 on a CPU with AVX512-BF16 (figures in
# BENCHMARKS.md, Speedrun); where bf16 is emulated (AVX2-only CPUs) they would be far slower
NS_DTYPE_CPU = "bf16" if native_bf16() else "fp32"

# --init-from: a pretrained model needs a gentler peak and little warmup (BENCHMARKS.md,
# "Fine-tuning": a char-cpu model fine-tuned on new text for 100 steps on a CPU)
FINETUNE_LR = 1e-3
FINETUNE_WARMUP = 10


def warmup_rule(f: dict[str, Any]) -> int:
    return min(100, f["max_steps"] // 10) if f["max_steps"] else 20


def eval_every_rule(f: dict[str, Any]) -> int | None:
    return max(1, f["max_steps"] // 10) if f["max_steps"] else None


# what a run recorded before these fields existed ran with (a resume fills them from here, not
# from DEFAULTS, whose values may change)
BEFORE_RECORDED: dict[str, Any] = {
    "optimizer": "adamw",
    "embed_lr_scale": 1.0,
    "head_lr_scale": 1.0,
    "decay_fraction": 0.2,
}

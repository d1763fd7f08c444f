"""--lora: LoRA as an option of the tasks that fine-tune (lm, sft), and what a LoRA run saves.

    LoRAFields        the fields (--lora, --lora-r, --lora-alpha, --lora-dropout,
                      --lora-targets) a task's options dataclass inherits; .lora_config()
                      -> LoRAConfig | None
    adapt(model, fields) -> model   adapters applied (the base frozen; made int8/int4 first
                      with --lora-base: training.qlora), or the model as it was without --lora
    lora_base(fields) -> "float" | "int8" | "int4" | "keep"   how --init-from is opened (a
                      GGUF file's blocks kept unless "float"; see training.qlora)
    check_lora_source(fields, init_from)   --lora without --init-from is refused
    hold_base(model, bf16) -> int   under bf16 autocast, the float frozen base's adapted linears
                      held in bf16 (autocast rounds them so at every matmul anyway: the same
                      numbers, half the memory, no cast per forward); how many were
    base_note(model) -> str   ", LoRA base bf16" (or fp32, int8, ...) for the run's header line
    save_run_model(d, model, tokenizer, origin)  a LoRA model: only its adapters and the base
                      reference (interop.adapters.save_lora_folder); any other: save_model
    restore_run_model(model, run, origin)   the adapters (or the whole model) back from a run,
                      a LoRA run's base checked to be the one it was trained on (a run saved
                      before the hash left names out: its older hash checked, on the same files)

The optimizer needs nothing special: it takes the parameters that require gradients, and
apply_lora leaves only the adapters so. Deliberately unaware of the loop and of objectives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from lamina.checkpoint import load_state, load_tensors, save_model, unwrap
from lamina.errors import LaminaError
from lamina.interop.adapters import ADAPTERS_FILE, read_lora_folder, save_lora_folder
from lamina.interop.origin import Origin
from lamina.lora import (
    DEFAULT_TARGETS,
    LoRAConfig,
    apply_lora,
    load_lora_state,
    lora_config,
    lora_modules,
)
from lamina.tokenizers.kinds import Tokenizer
from lamina.training.defaults import option
from lamina.training.qlora import BASES, base_model
from lamina.validate import boolean, choice

LoRABase = Literal["float", "int8", "int4", "keep"]


@dataclass(frozen=True)
class LoRAFields:
    """The LoRA fields every fine-tuning task's options carry (one flag each)."""

    lora: bool = option(
        False,
        "train low-rank adapters on --init-from's linears, the base frozen (lamina.lora); the "
        "run saves only the adapters and the base's path and sha256",
    )
    lora_r: int = option(8, "with --lora, the rank of each adapter", metavar="R")
    lora_alpha: float = option(16.0, "with --lora, updates are scaled by alpha / r", metavar="A")
    lora_dropout: float = option(
        0.05, "with --lora, dropout on the adapters' input (training only)", metavar="P"
    )
    lora_targets: str = option(
        DEFAULT_TARGETS,
        "with --lora, what to adapt: presets qv, attn, mlp, all (attention + MLP), or names "
        "q,k,v,o,gate,up,fc,down,head",
        metavar="LIST",
    )
    lora_base: LoRABase = option(
        "float",
        "with --lora, the frozen base in fp32, or quantized to int8 / int4 weights (QLoRA: the "
        "adapters train over the quantized base; a GGUF file's Q8_0 / Q4_0 / Q4_1 blocks are "
        "kept as stored, never made float), or keep: a GGUF file's blocks as they are",
    )

    def __post_init__(self) -> None:
        boolean("lora", self.lora)
        choice("lora_base", self.lora_base, BASES)
        self._lora()  # every LoRA field checked, with or without --lora

    def _lora(self) -> LoRAConfig:
        return LoRAConfig(self.lora_r, self.lora_alpha, self.lora_dropout, self.lora_targets)

    def lora_config(self) -> LoRAConfig | None:
        return self._lora() if self.lora else None


def lora_of(options: Any) -> LoRAConfig | None:
    """The LoRA config a task's options ask for (None: no --lora, or a task without it)."""
    return options.lora_config() if isinstance(options, LoRAFields) else None


def check_lora_source(options: Any, init_from: str | None) -> None:
    if lora_of(options) is not None and init_from is None:
        raise LaminaError(
            "--lora trains adapters on a pretrained model: give --init-from MODEL (a run, "
            "model folder, Hugging Face folder or .gguf file)"
        )


def lora_base(options: Any) -> str:
    """How the base is held: --lora-base with --lora, else "float"."""
    return options.lora_base if lora_of(options) is not None else "float"


def adapt(model: nn.Module, options: Any) -> nn.Module:
    """apply_lora with the options' config, over the base --lora-base asks for
    (`qlora.base_model`); unchanged without --lora."""
    config = lora_of(options)
    if config is None:
        return model
    return apply_lora(base_model(model, options.lora_base), config)


def hold_base(model: nn.Module, bf16: bool) -> int:
    """A LoRA model's fp32 base linears (the adapted ones) held in bf16 when the run computes
    under bf16 autocast: it rounds their weights (and biases) to bf16 at every matmul, so the
    products are the same; what changes is no fp32 copy and no cast per forward. The adapters
    stay fp32. Returns how many linears changed (0: not LoRA, not bf16, or a quantized base)."""
    inner = unwrap(model)
    if not bf16 or lora_config(inner) is None:
        return 0
    bases = [m.base for m in lora_modules(inner).values()]
    held = [b for b in bases if isinstance(b, nn.Linear) and b.weight.dtype == torch.float32]
    for b in held:
        b.to(torch.bfloat16)
    return len(held)


def base_note(model: nn.Module) -> str:
    """How a LoRA model's frozen base is held, for the run's first line ("" without LoRA)."""
    inner = unwrap(model)
    if lora_config(inner) is None:
        return ""
    quantized = getattr(inner, "quantization", None)
    if quantized:
        return f", LoRA base {quantized.get('scheme', 'quantized')}"
    dtype = next(iter(lora_modules(inner).values())).base.weight.dtype
    return f", LoRA base {str(dtype).removeprefix('torch.').replace('bfloat16', 'bf16')}"


def _base_record(origin: dict[str, Any] | None) -> dict[str, Any]:
    if not origin or "sha256" not in origin:
        raise LaminaError("a LoRA run needs the --init-from record of its base (path, sha256)")
    return {"kind": origin.get("kind"), "path": origin["source"], "sha256": origin["sha256"]}


def save_run_model(
    d: Path, model: nn.Module, tokenizer: Tokenizer | None, origin: dict[str, Any] | None
) -> None:
    """What a checkpoint holds of the model: the adapters and the base reference, or all."""
    if lora_config(unwrap(model)) is not None:
        save_lora_folder(d, model, _base_record(origin))
    else:
        save_model(d, model, tokenizer)


def _legacy_hash(origin: dict[str, Any] | None) -> str | None:
    """The hash runs recorded before the base hash left names out (`Origin.legacy_hash`) of
    the base as it is now, from the files the --init-from record lists."""
    files = (origin or {}).get("files")
    if not files:
        return None
    return Origin(origin["kind"], Path(origin["source"]), tuple(Path(f) for f in files)).legacy_hash


def restore_run_model(model: nn.Module, run: Path, origin: dict[str, Any] | None) -> None:
    """Load a checkpoint's model tensors into `model` (for a LoRA run, the adapters only)."""
    inner = unwrap(model)
    if lora_config(inner) is None:
        load_state(model, load_tensors(run / "model.safetensors"), "model.safetensors")
        return
    config, base, tensors = read_lora_folder(run)
    if config != lora_config(inner):
        raise LaminaError(f"--resume {run}: its adapters were made with {config}, not this run's")
    want = _base_record(origin)["sha256"]
    got = base.get("sha256") if isinstance(base, dict) else None
    if got != want and not (got is not None and got == _legacy_hash(origin)):
        raise LaminaError(
            f"--resume {run}: its adapters were trained on another base than --init-from's "
            f"(sha256 {str(got)[:12]}... != {want[:12]}...); resume with the base it was "
            "trained on, or start a new run from this one"
        )
    load_lora_state(inner, tensors, str(run / ADAPTERS_FILE))

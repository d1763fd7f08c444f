"""Where and in what precision a run computes, and whether its model fits there.

    resolve_device("auto") -> torch.device        cuda, then mps, then cpu
    use_bf16(dtype, device, d_model) -> bool      what --dtype auto means (see BF16_MIN_WIDTH)
    autocast(device, bf16) -> context             bf16 autocast where use_bf16 said so
    maybe_compile(model, enabled, notify)         --compile, eager if compiling fails
    memory_bytes(device) -> int | None            a GPU's memory, else this machine's RAM
    check_model_fits(config, device)              a GPT whose weights + AdamW state (16 bytes a
        parameter, counted by formula) exceed the memory of this machine (or of the GPU) is
        refused before it is built

The measured reasons for the bf16 rule are in BENCHMARKS.md ("Training"); whether a CPU has
native bf16 is `lamina.cpu.native_bf16`, the one test for it.

Deliberately unaware of tasks, the loop, checkpoints and the command line.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from torch import nn

from lamina.cpu import native_bf16
from lamina.errors import LaminaError
from lamina.lora import LoRAConfig
from lamina.lora_size import fit_bytes
from lamina.models.config import GPTConfig
from lamina.models.params import count_params


def maybe_compile(model: nn.Module, enabled: bool, notify: Any) -> nn.Module:
    """torch.compile(model) with --compile, or the model as it is if compiling fails."""
    if not enabled:
        return model
    try:
        return torch.compile(model)
    except Exception as exc:  # noqa: BLE001 - any failure means "run eagerly"
        notify(f"torch.compile unavailable ({type(exc).__name__}: {exc}); running eagerly")
        return model


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


# bf16 autocast pays off on CPUs only with native bf16 matrix units (AMX / AVX512-BF16): with
# the fused attention kept in fp32 while training (lamina.cpu.upcast_attention) a step measured
# 1.34x fp32's at 128 wide and 2.1x at 384 (bench/step.py shapes A and B on AMX; BENCHMARKS.md);
# narrower models were not measured, so they stay fp32
BF16_MIN_WIDTH = 128


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if _mps_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise LaminaError("--device cuda: no CUDA device is available")
    if name == "mps" and not _mps_available():
        raise LaminaError("--device mps: the MPS backend is not available")
    return torch.device(name)


def use_bf16(dtype: str, device: torch.device, d_model: int) -> bool:
    """Whether to train under bf16 autocast: explicit, or by `auto`'s measured rule."""
    if dtype == "fp32":
        return False
    if dtype == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise LaminaError("--dtype bf16: this CUDA device does not support bf16")
        return True
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return native_bf16() and d_model >= BF16_MIN_WIDTH
    return False


def memory_bytes(device: torch.device) -> int | None:
    """Total memory of `device` (a CUDA GPU's, else this machine's RAM); None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def check_model_fits(
    config: GPTConfig, device: torch.device, lora: LoRAConfig | None = None
) -> None:
    """Refuse a GPT whose fp32 weights, gradients and AdamW moments exceed `device`'s memory
    (with LoRA: the frozen base's weights and the adapters' weights, gradients, moments)."""
    n = count_params(config)
    need, have = fit_bytes(config, lora), memory_bytes(device)
    if have is not None and need > have:
        raise LaminaError(
            f"a GPT of {n:,} parameters (d_model {config.d_model}, n_layers {config.n_layers}, "
            f"vocab_size {config.vocab_size}, block_size {config.block_size}) needs about "
            f"{need / 2**30:,.1f} GiB to train (weights, gradients, AdamW{', LoRA' if lora else ''}) but {device} has "
            f"{have / 2**30:,.1f} GiB; choose a smaller shape"
        )

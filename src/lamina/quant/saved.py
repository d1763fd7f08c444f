"""A quantized GPT's tensors for saving, and its modules made whole after loading.

    scheme_of(model) -> {"scheme": "int8"} | {"scheme": "int4", "group_size": g} | None
    quantized_tensors(model) -> the tensors to save, each stored once
    finish_loading(model) -> after ``load_state_dict(assign=True)``: ties and kernel tensors

Deliberately unaware of file formats: lamina.checkpoint writes and reads the tensors.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from lamina.errors import LaminaError
from lamina.models.gpt import GPT
from lamina.quant.linear import Int4Linear, Int8Linear

SCHEMES = ("int8", "int4")


def scheme_of(model: nn.Module) -> dict[str, Any] | None:
    """{"scheme": "int8"} or {"scheme": "int4", "group_size": g}; None for a float model."""
    return getattr(model, "quantization", None)


def quantized_tensors(model: GPT) -> dict[str, Tensor]:
    """The tensors to save: each stored once (a tied int8 head is the token table's)."""
    if (scheme_of(model) or {}).get("scheme") not in SCHEMES:
        raise LaminaError(
            f"a model quantized as {scheme_of(model)} (GGUF blocks kept) cannot be saved as a "
            "lamina folder yet: open the GGUF file itself, or load it in fp32 and quantize"
        )
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_weights and scheme_of(model) == {"scheme": "int8"}:
        state.pop("head.qweight"), state.pop("head.scale")
    return state


def finish_loading(model: GPT) -> None:
    """After ``load_state_dict(assign=True)``: re-tie a tied int8 head to the token table and
    build each layer's kernel-side tensors from the loaded ones."""
    if model.config.tie_weights and scheme_of(model) == {"scheme": "int8"}:
        model.head.qweight, model.head.scale = model.embed.wte.qweight, model.embed.wte.scale
    for m in model.modules():
        if isinstance(m, (Int8Linear, Int4Linear)):
            m.prepare()

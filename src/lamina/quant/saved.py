"""A quantized GPT's tensors for saving, and its modules made whole after loading.

    scheme_of(model) -> {"scheme": "int8"} | {"scheme": "int4", "group_size": g} | None
    quantized_tensors(model) -> the tensors to save, each stored once
    finish_loading(model) -> after ``load_state_dict(assign=True)``: ties and kernel tensors
    prepare_kernels(model) -> each quantized layer's kernel tensors, for the kernel that will
                              run it (native alone where the native step covers the model)

Deliberately unaware of file formats: lamina.checkpoint writes and reads the tensors.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

import lamina.cpu as cpu
from lamina.errors import LaminaError
from lamina.models.gpt import GPT
from lamina.native.coverage import unsupported
from lamina.quant.int8mm import mark_roles
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
    prepare_kernels(model)


def prepare_kernels(model: GPT) -> None:
    """Build each int8/int4 layer's kernel tensors. Where the native step covers the whole
    model (lamina.cpu.native_step and lamina.native's unsupported), the layers prepare for the
    native kernel alone: every decode step runs natively, and a longer call (a prefill) runs
    dequantized, so no packed copy of the weights is made that nothing would read
    (bench/kquant_decode.py measured both the memory and the prefill). Elsewhere each layer
    prepares for lamina.cpu's layer kernel. It also marks the linears' roles for a prefill's
    int8 products (lamina.quant.int8mm.mark_roles)."""
    mark_roles(model)
    kernel = "native" if cpu.native_step() and unsupported(model) is None else None
    for m in model.modules():
        if isinstance(m, (Int8Linear, Int4Linear)):
            m.prepare(kernel)

"""Quantizing a GPT: its linears (and a tied token table) replaced by lamina.quant's modules.

    quantize(model, "int8" | "int4", group_size=None) -> the same GPT, quantized in place
    quantize_structure(model, scheme, group_size) -> the modules, empty, for ``load_state_dict``
    on_read(model, scheme, group_size=None) -> convert(name, float tensor) -> quantized tensors:
        for a loader that reads float tensors one at a time (no full fp32 copy is ever held)

What is quantized: every ``nn.Linear`` inside the blocks (attention, feed-forward) and the head.
Embedding tables stay exact, except a head tied to the token table: then one int8 table with a
scale per row serves both the head's matmul and the lookups (a row's lookup is exactly what the
head multiplies by), so the tie costs no second copy. With int4 the tied head gets its own int4
copy and the lookups read an int8 table (int4's packed layout cannot be gathered by row).

Deliberately unaware of files and kernels.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from lamina.errors import LaminaError
from lamina.models.gpt import GPT
from lamina.quant.linear import (
    INT4_GROUP_SIZES,
    Int4Linear,
    Int8Embedding,
    Int8Linear,
    quantize_int4,
    quantize_int8,
)
from lamina.quant.saved import SCHEMES, prepare_kernels, scheme_of


def _check_scheme(scheme: str, group_size: int) -> None:
    if scheme not in SCHEMES:
        raise LaminaError(
            f"unknown quantization scheme {scheme!r}; choose one of {', '.join(SCHEMES)}"
        )
    if scheme == "int4" and group_size not in INT4_GROUP_SIZES:
        raise LaminaError(
            f"group_size must be one of {', '.join(map(str, INT4_GROUP_SIZES))} for int4, got {group_size!r}"
        )


def _block_linears(model: GPT) -> list[tuple[nn.Module, str, nn.Linear]]:
    return [
        (parent, name, child)
        for parent in model.blocks.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]


def quantize_structure(model: GPT, scheme: str, group_size: int = 128) -> GPT:
    """Replace the linears (and a tied token table) by empty quantized modules, in place.

    For loading a saved quantized model: build the GPT on the meta device, call this, then
    ``load_state_dict(tensors, assign=True)``. ``quantize`` fills the same modules from weights.
    """
    return _replace(model, scheme, group_size, fill=False)


def quantize(model: GPT, scheme: str = "int8", *, group_size: int | None = None) -> GPT:
    """Quantize a GPT's linear layers in place (and return it) for inference.

    scheme: "int8" (a scale per output row) or "int4" (a scale and zero per ``group_size``
    inputs; group_size one of 32, 64, 128, 256 and dividing every layer's input width; None:
    the largest of them that divides every width, so a caller without a group-size flag, such
    as `lamina sample --quantize int4`, never has to ask for one).
    """
    if not isinstance(model, GPT):
        raise LaminaError(f"quantize needs a lamina GPT, got {type(model).__name__}")
    if scheme_of(model) is not None:
        raise LaminaError(f"this model is already quantized ({scheme_of(model)['scheme']})")
    if group_size is None:
        group_size = _largest_group(model) if scheme == "int4" else 128
    _check_scheme(scheme, group_size)
    return _replace(model, scheme, group_size, fill=True)


def on_read(
    model: GPT, scheme: str, group_size: int | None = None
) -> Callable[[str, Tensor], dict[str, Tensor]]:
    """Make a GPT built on the meta device quantized (empty modules, as quantize_structure) and
    return what a loader calls with each float tensor it reads, by name: the quantized model's
    tensors made from it (a linear's weight -> its qweight and scales; a tied token table -> its
    int8 rows, and an int4 head's own copy), any other tensor as it is. The float tensor can be
    dropped as soon as the call returns. group_size None: as `quantize` chooses."""
    if scheme_of(model) is not None:
        raise LaminaError(f"this model is already quantized ({scheme_of(model)['scheme']})")
    if group_size is None:
        group_size = _largest_group(model) if scheme == "int4" else 128
    targets = {id(lin) for _, _, lin in _block_linears(model)} | {id(model.head)}
    linears = {f"{name}.weight" for name, m in model.named_modules() if id(m) in targets}
    tied = model.config.tie_weights
    _replace(model, scheme, group_size, fill=False)

    def quantized(prefix: str, w: Tensor) -> dict[str, Tensor]:
        if scheme == "int8":
            q, s = quantize_int8(w)
            return {f"{prefix}.qweight": q, f"{prefix}.scale": s}
        q, sz = quantize_int4(w, group_size)
        return {f"{prefix}.qweight": q, f"{prefix}.scales_and_zeros": sz}

    def convert(name: str, t: Tensor) -> dict[str, Tensor]:
        if name in linears:
            return quantized(name.removesuffix(".weight"), t)
        if tied and name == "embed.wte.weight":
            q, s = quantize_int8(t)
            table = {"embed.wte.qweight": q, "embed.wte.scale": s}
            return table | (quantized("head", t) if scheme == "int4" else {})
        return {name: t}

    return convert


def _largest_group(model: GPT) -> int:
    widths = sorted(
        {lin.in_features for _, _, lin in _block_linears(model)} | {model.head.in_features}
    )
    for g in sorted(INT4_GROUP_SIZES, reverse=True):
        if all(w % g == 0 for w in widths):
            return g
    raise LaminaError(
        f"no int4 group size ({', '.join(map(str, INT4_GROUP_SIZES))}) divides every input "
        f"width of this model ({', '.join(map(str, widths))}); use int8"
    )


def _replace(model: GPT, scheme: str, group_size: int, *, fill: bool) -> GPT:
    _check_scheme(scheme, group_size)
    targets = _block_linears(model) + [(model, "head", model.head)]
    if scheme == "int4":
        for _, name, lin in targets:
            if lin.in_features % group_size:
                raise LaminaError(
                    f"group_size {group_size} does not divide the input width {lin.in_features} "
                    f"of {name}; choose a group size that divides every layer's width"
                )
    tied = model.config.tie_weights
    device = model.head.weight.device
    for parent, name, lin in targets:
        bias = lin.bias is not None
        if scheme == "int8":
            new = (
                Int8Linear.from_linear(lin)
                if fill
                else Int8Linear(lin.in_features, lin.out_features, bias, device)
            )
        else:
            new = (
                Int4Linear.from_linear(lin, group_size)
                if fill
                else Int4Linear(lin.in_features, lin.out_features, bias, group_size, device)
            )
        setattr(parent, name, new)
    if tied:
        wte = model.embed.wte
        table = Int8Embedding(wte.num_embeddings, wte.embedding_dim, device)
        if fill:
            table.qweight, table.scale = quantize_int8(wte.weight)
        if scheme == "int8":  # one tensor for both: the head multiplies by the rows looked up
            model.head.qweight, model.head.scale = table.qweight, table.scale
            if fill:
                model.head.prepare()
        model.embed.wte = table
    for p in model.parameters():
        p.requires_grad_(False)
    model.quantization = {"scheme": scheme} | (
        {"group_size": group_size} if scheme == "int4" else {}
    )
    if fill:  # the kernels a loaded copy of this model would prepare (lamina.quant.saved)
        prepare_kernels(model)
    return model.eval()

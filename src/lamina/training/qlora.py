"""--lora-base: the frozen base of a LoRA run kept quantized (QLoRA), never a float copy of a
base that comes quantized.

    BASES = ("float", "int8", "int4", "keep")
    base_model(model, base) -> the GPT as a LoRA run's frozen base:
        float  as it came (dequantized to fp32 by the caller)
        int8 / int4  every block linear and the head in that scheme: a layer that already is
               (a GGUF file's Q8_0 / Q4_0 / Q4_1 blocks, opened kept) stays exactly as stored;
               any other is quantized from its float or dequantized weights one layer at a
               time (int4: the largest group size in quant.INT4_GROUP_SIZES dividing every
               input width)
        keep   the GGUF file's blocks as they are (whatever quantized modules lamina keeps)
    HeadRows(head)  the token lookups of a model whose tied head is int4: the rows are read
                    from the head's own blocks (the same numbers the table held), so the table
                    costs nothing; GGUF Q4 files otherwise bring the table dequantized to fp32.
                    A tied head that is float becomes one int8 table serving both (as
                    quant.quantize makes it); a GGUF Q8_0 table is kept as it is.
    int4_rows(layer, index), int8_rows(layer, index)   rows of a layer's W, dequantized: the
                    head (a FrozenLinear) is multiplied CHUNK rows at a time, forward and back
    wants_quantized(base) -> whether the source should be opened with its blocks kept

The kernels' extra copies of the weights (packed layouts, per-row requantized int8) are dropped:
a training step multiplies by the dequantized weights (`lora.frozen_linear`, which gives the
gradient to the input without keeping the float weights between forward and backward), and so
does an evaluation of many rows.

Deliberately unaware of files, optimizers and the loop.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lamina.errors import LaminaError
from lamina.frozen_linear import FrozenLinear
from lamina.models.gpt import GPT
from lamina.quant import INT4_GROUP_SIZES, Int4Linear, Int8Embedding, Int8Linear, quantize_int8

BASES = ("float", "int8", "int4", "keep")
KERNEL_COPIES = ("kernel_weight", "kernel_scale", "kernel_sz", "native_scale", "native_min")


def wants_quantized(base: str) -> bool:
    return base != "float"


def int4_rows(
    m: Int4Linear, index: Any, dtype: torch.dtype = torch.float32, out: Tensor | None = None
) -> Tensor:
    """Rows `index` (a slice or a tensor of ids) of an int4 layer's W: (q - 8) * s + z (into
    `out`, an fp32 tensor of their shape, where given)."""
    return m.dequantized(dtype, rows=index, out=out)


def int8_rows(
    m: Int8Linear, index: Any, dtype: torch.dtype = torch.float32, out: Tensor | None = None
) -> Tensor:
    """Rows `index` of an int8 layer's W: q * s (a scale per row, or per group of a row)."""
    return m.dequantized(dtype, rows=index, out=out)


def _row_reader(m: nn.Module) -> Any:
    read = {Int4Linear: int4_rows, Int8Linear: int8_rows}.get(type(m))
    return (
        None if read is None else (lambda a, b, dtype, out=None: read(m, slice(a, b), dtype, out))
    )


class HeadRows(nn.Module):
    """Token lookups that read a tied int4 head's rows (the numbers the table held)."""

    def __init__(self, head: Int4Linear) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features
        self._head = [head]  # not a submodule: its tensors are the head's, saved there

    def forward(self, ids: Tensor) -> Tensor:
        return int4_rows(self._head[0], ids)


def _group_size(model: GPT) -> int:
    c = model.config
    widths = (c.d_model, c.ff_width, c.n_heads * c.head_dim)
    for g in sorted(INT4_GROUP_SIZES, reverse=True):
        if all(w % g == 0 for w in widths):
            return g
    raise LaminaError(f"--lora-base int4: no group size in {INT4_GROUP_SIZES} divides {widths}")


def _float_linear(m: nn.Module) -> nn.Linear:
    """`m` as a float nn.Linear (itself, or its dequantized weights): one layer at a time."""
    if isinstance(m, nn.Linear):
        return m
    plain = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
    with torch.no_grad():
        plain.weight = nn.Parameter(m.dequantized(torch.float32), requires_grad=False)
        if m.bias is not None:
            plain.bias = nn.Parameter(m.bias.detach().float(), requires_grad=False)
    return plain


def _linears(model: GPT) -> list[tuple[nn.Module, str, nn.Module]]:
    out = [
        (parent, name, child)
        for parent in model.blocks.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) or hasattr(child, "dequantized")
    ]
    return [*out, (model, "head", model.head)]


def _to_scheme(model: GPT, scheme: str) -> None:
    kind = Int8Linear if scheme == "int8" else Int4Linear
    group = _group_size(model) if scheme == "int4" else None
    tied = model.config.tie_weights
    for parent, name, m in _linears(model):
        if isinstance(m, kind) or (tied and name == "head" and parent is model):
            continue  # kept as stored; a tied head is the table's (below)
        lin = _float_linear(m)
        new = Int8Linear.from_linear(lin) if group is None else Int4Linear.from_linear(lin, group)
        setattr(parent, name, new)
        del lin
    head = model.head
    # a tied head: an int8 table serving lookups and head at once (kept if it is one already,
    # e.g. GGUF Q8_0); a GGUF int4 head stays int4 with --lora-base int4 (HeadRows reads it)
    if (
        tied
        and not isinstance(head, Int8Linear)
        and not (scheme == "int4" and isinstance(head, Int4Linear))
    ):
        weight = head.weight if isinstance(head, nn.Linear) else _float_linear(head).weight
        table = Int8Embedding(head.out_features, head.in_features)
        table.qweight, table.scale = quantize_int8(weight)
        del weight
        model.embed.wte = table
        model.head = Int8Linear(head.in_features, head.out_features, False)
        model.head.qweight, model.head.scale = table.qweight, table.scale  # one tensor, as quant
    model.quantization = {"scheme": scheme} | ({"group_size": group} if group else {})


def base_model(model: GPT, base: str) -> GPT:
    """The frozen base a LoRA run trains over (see the module docstring), in place."""
    if base not in BASES:
        raise LaminaError(f"--lora-base must be one of {', '.join(BASES)}, got {base!r}")
    if base == "float":
        return model
    quantized = getattr(model, "quantization", None)
    if base == "keep":
        if quantized is None:
            raise LaminaError(
                "--lora-base keep keeps a GGUF file's quantized blocks: --init-from is not a "
                "quantized GGUF file; use --lora-base int8 or int4"
            )
    else:
        _to_scheme(model, base)
    if model.config.tie_weights and isinstance(model.head, Int4Linear):
        model.embed.wte = HeadRows(model.head)
    head = model.head  # read a chunk of rows at a time: its float copy is never whole
    model.head = FrozenLinear(head, _row_reader(head))
    for m in model.modules():
        if isinstance(m, Int4Linear):  # the saved form back before the native copies go
            m.restore_saved_scales()
        for name in KERNEL_COPIES:
            if getattr(m, name, None) is not None:
                setattr(m, name, None)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def base_bytes(model: nn.Module) -> int:
    """Bytes the model's tensors hold (each storage once)."""
    seen: dict[Any, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())

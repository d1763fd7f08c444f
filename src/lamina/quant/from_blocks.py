"""A GPT whose linears keep a GGUF file's quantized blocks: Q4_0/Q4_1 -> int4, Q8_0 -> int8,
K-quants (and Q5_0/Q5_1) as the file stores them.

    from_blocks(model, state, qtypes) -> the GPT, quantized where its weights came as blocks
    keepable({lamina name: [foreign tensor parts]}) -> {lamina name: qtype(s)} from_blocks keeps

`model` is a GPT on the meta device; `state` maps lamina tensor names to float tensors, or, for
the names in `qtypes`, to the rows' raw bytes (see `ggml.row_bytes`; a loader applies its row
transforms to those first). A qtype is a string, "Q8_0" | "Q4_0" | "Q4_1": the linear takes
lamina's exact int8/int4 form (group size 32, see quant/ggml.py); or a tuple of the qtypes of
the tensor's parts, each of kquant.KEPT: the linear is a kquant.BlockLinear holding the blocks
untouched (its state value the stacked rows where the parts share one qtype, else a list of
each part's rows). The token table: Q8_0 becomes an int8 table with a scale per 32, a kept
qtype a kquant.BlockEmbedding (a tied head then *is* that table, stored once); any other type
is dequantized to fp32 for lookups (a tied head keeps its own int4 copy). Blocks of tensors
that are not linear weights are dequantized. The model's `quantization` is
{"scheme": "gguf", "types": [...]}; saving it as a lamina folder is refused (not yet supported).

Deliberately unaware of files and of GGUF's tensor names: the loader maps names first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lamina.errors import LaminaError
from lamina.models.gpt import GPT
from lamina.quant import Int4Linear, Int8Embedding, Int8Linear
from lamina.quant.ggml import (
    BLOCK_QTYPES,
    GROUP,
    blocks_to_int4,
    blocks_to_int8,
    dequantize_rows,
)
from lamina.quant.kquant import BLOCKS, KEPT, BlockEmbedding, BlockLinear, dequantize_blocks
from lamina.quant.saved import prepare_kernels

QType = str | tuple[str, ...]


def keepable(parts: Mapping[str, Sequence[Any]]) -> dict[str, QType]:
    """lamina name -> qtype, for the 2-D weights whose parts (objects with .qtype and .shape,
    e.g. q, k and v of a fused qkv) all share one block type lamina converts exactly; or ->
    the parts' qtypes (a tuple), where each is one that kquant keeps as stored."""
    kept: dict[str, QType] = {}
    for name, group in parts.items():
        if not all(len(p.shape) == 2 for p in group):
            continue
        types = tuple(p.qtype for p in group)
        if len(set(types)) == 1 and types[0] in BLOCK_QTYPES:
            kept[name] = types[0]
        elif all(
            t in KEPT and p.shape[1] % BLOCKS[t][0] == 0 for t, p in zip(types, group, strict=True)
        ):
            kept[name] = types
    return kept


def _parts(value: Tensor | list[Tensor], qtypes: tuple[str, ...]) -> list[tuple[str, Tensor]]:
    """A kept tensor's parts as (qtype, rows), each copied off the file's map."""
    if isinstance(value, list):
        return [(q, r.clone()) for q, r in zip(qtypes, value, strict=True)]
    if len(set(qtypes)) != 1:
        raise LaminaError(f"rows of mixed GGML types {qtypes} must come as one tensor per part")
    return [(qtypes[0], value.clone())]


def _linear(
    lin: nn.Linear, rows: Tensor, qtype: QType, bias: Tensor | None
) -> Int8Linear | Int4Linear | BlockLinear:
    shape = (lin.out_features, lin.in_features)
    if isinstance(qtype, tuple):
        return BlockLinear(lin.in_features, lin.out_features, _parts(rows, qtype), bias)
    if qtype == "Q8_0":
        m = Int8Linear(*shape[::-1], False, group_size=GROUP)
        m.qweight, m.scale = blocks_to_int8(rows.numpy(), qtype, shape)
    else:
        m = Int4Linear(*shape[::-1], False, GROUP)
        m.qweight, m.scales_and_zeros = blocks_to_int4(rows.numpy(), qtype, shape)
    if bias is not None:
        m.bias = nn.Parameter(bias.float(), requires_grad=False)
    return m


def _linears(model: GPT) -> dict[str, tuple[nn.Module, str, nn.Linear]]:
    out = {
        f"blocks.{name}.{child_name}.weight".replace("..", "."): (parent, child_name, child)
        for name, parent in model.blocks.named_modules()
        for child_name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    }
    out["head.weight"] = (model, "head", model.head)
    return out


def from_blocks(model: GPT, state: Mapping[str, Any], qtypes: Mapping[str, QType]) -> GPT:
    """Quantized modules for the block-typed weights, float ones for the rest; see the module."""
    if not isinstance(model, GPT):
        raise LaminaError(f"from_blocks needs a lamina GPT, got {type(model).__name__}")
    tied = model.config.tie_weights
    table_type = qtypes.get("embed.wte.weight")
    # `state` may read each tensor only when asked (a file's loader): every tensor is asked for
    # once where it is converted, and none is kept here but what the model ends up holding
    names = set(state) - ({"head.weight"} if tied else set())

    def source(name: str) -> str:  # a tied head's blocks are the token table's
        return "embed.wte.weight" if tied and name == "head.weight" else name

    linears = _linears(model)
    done: set[str] = set()
    if isinstance(table_type, tuple):  # kept as stored; a tied head reads the very same rows
        wte = model.embed.wte
        [(qtype, rows)] = _parts(state["embed.wte.weight"], table_type)
        model.embed.wte = BlockEmbedding(qtype, rows, wte.embedding_dim)
        if tied:
            model.head = BlockLinear(wte.embedding_dim, wte.num_embeddings, [(qtype, rows)])
            done.add("head.weight")
        done.add("embed.wte.weight")
    elif tied and table_type is not None and table_type != "Q8_0":
        qtypes = {**qtypes, "head.weight": table_type}  # its own int4 copy
        names.add("head.weight")
    for name, qtype in qtypes.items():
        if name in linears and name in names and name not in done:
            parent, attr, lin = linears[name]
            bias = name.removesuffix("weight") + "bias"
            b = state[bias] if lin.bias is not None else None
            setattr(parent, attr, _linear(lin, state[source(name)], qtype, b))
            done.update((name, bias) if b is not None else (name,))
    if table_type == "Q8_0":
        wte = model.embed.wte
        table = Int8Embedding(wte.num_embeddings, wte.embedding_dim, group_size=GROUP)
        table.qweight, table.scale = blocks_to_int8(
            state["embed.wte.weight"].numpy(), "Q8_0", (wte.num_embeddings, wte.embedding_dim)
        )
        model.embed.wte = table
        if tied:  # one tensor for both (read once): the head multiplies by the rows looked up
            head = Int8Linear(wte.embedding_dim, wte.num_embeddings, False, group_size=GROUP)
            head.qweight, head.scale = table.qweight, table.scale
            model.head = head
            done.add("head.weight")
        done.add("embed.wte.weight")
    floats = {}
    for name in sorted(names - done):  # a tied head is among `done`, or not in `names`
        floats[name] = state[name]
        if name in qtypes:  # block-typed, but not a linear's weight
            qtype, width = qtypes[name], _width(model, name)
            if isinstance(qtype, tuple):
                rows = torch.cat([r for _, r in _parts(floats[name], qtype)])
                floats[name] = dequantize_blocks(qtype[0], rows, width)
            else:
                floats[name] = dequantize_rows(floats[name], qtype, width)
    model.load_state_dict(floats, strict=False, assign=True)
    if tied and table_type is None:  # a float table: the head is that very Parameter
        model.embed.tie_lm_head(model.head)
    for p in model.parameters():
        p.requires_grad_(False)
    prepare_kernels(model)
    for m in model.modules():  # run, never saved: the native kernel's scales alone (no copy)
        if isinstance(m, Int4Linear):
            m.drop_saved_scales()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise LaminaError(f"no weights for {', '.join(left[:8])}")
    kinds = sorted({t for n, q in qtypes.items() if n in done for t in _each(q)})
    model.quantization = {"scheme": "gguf", "types": kinds}
    return model.eval()


def _each(qtype: QType) -> tuple[str, ...]:
    return qtype if isinstance(qtype, tuple) else (qtype,)


def _width(model: GPT, name: str) -> int:
    return int(model.state_dict()[name].shape[-1])

"""Tensor names, lamina's against a family's HF and GGUF ones, both directions (one mechanism).

    rows(config, lamina_shapes, family, fmt) -> list[Row]   fmt "hf" or "gguf": the rows of
                                                    one model, from the family record's table
    foreign_shapes(family, config, fmt) -> {foreign name: shape}   what a file would hold
    lamina_shapes(config) / shapes_of(model) -> {lamina name: shape}   a GPT's own tensors
    check(rows, foreign_shapes, where, implied)     missing / unexpected / misshapen, one line
    to_lamina(rows, fetch) -> {lamina name: Tensor}   fetch(foreign name) -> Tensor
    to_foreign(rows, state) -> {foreign name: Tensor}

The names live in the records (`families`): each lamina tensor -> (HF spec, GGUF spec). A row
is one lamina tensor and the foreign tensors it is made of: several when lamina fuses what the
other keeps apart ([q | k | v] in `attn.qkv`, [gate | up] in `ff.fc`), stacked along dim 0.
Each part has a transform:
- "T": HF GPT-2's Conv1D stores (in, out), the transpose of nn.Linear's (out, in);
- "Rq" / "Rk": llama.cpp's converter permutes the rows of q (n_heads) and k (n_kv_heads) of
  arch llama for its interleaved rotary layout (`LlamaModel.permute`: rows viewed as (heads, 2,
  hd / 2) and the last two axes swapped); lamina, like HF, pairs the two halves of each head;
- "+1": llama.cpp stores Gemma's `1 + weight` norm gains with the one added.
Which rows apply follows from the lamina model's own tensor names (its `state_dict` on the meta
device); a lamina tensor with no name in the family's format is refused. A tied head is not a
row (it is the token table). Deliberately unaware of files and of how tensors are read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from lamina.errors import LaminaError
from lamina.interop.family import Family
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.native.ggml_blocks import rope_halves, rope_pairs

FORMATS = ("hf", "gguf")


@dataclass(frozen=True)
class Transform:
    """How a foreign tensor becomes its slice of a lamina tensor and back."""

    name: str
    to_lamina: Callable[[Tensor], Tensor]
    to_foreign: Callable[[Tensor], Tensor]
    foreign_shape: Callable[[tuple[int, ...]], tuple[int, ...]]


def _same(t: Tensor) -> Tensor:
    return t


SAME = Transform("same", _same, _same, lambda s: s)
TRANSPOSE = Transform("transposed", lambda t: t.t(), lambda t: t.t(), lambda s: s[::-1])
PLUS_ONE = Transform("stored plus one", lambda t: t - 1, lambda t: t + 1, lambda s: s)


def rope_permutation(n_heads: int) -> Transform:
    """llama.cpp's q/k row order <-> HF's (and lamina's), for `n_heads` heads of rows."""

    def to_foreign(t: Tensor) -> Tensor:  # llama.cpp's LlamaModel.permute
        return rope_pairs(t, n_heads)

    def to_lamina(t: Tensor) -> Tensor:  # its inverse (transformers' _reverse_permute_weights)
        return rope_halves(t, n_heads)

    return Transform(f"rope-permuted({n_heads} heads)", to_lamina, to_foreign, lambda s: s)


@dataclass(frozen=True)
class Part:
    foreign: str
    rows: int  # rows of the lamina tensor this part fills (dim 0)
    transform: Transform


@dataclass(frozen=True)
class Row:
    lamina: str
    shape: tuple[int, ...]  # the lamina tensor's
    parts: tuple[Part, ...]

    def foreign_shapes(self) -> list[tuple[int, ...]]:
        return [p.transform.foreign_shape((p.rows, *self.shape[1:])) for p in self.parts]


def _split_rows(config: GPTConfig, name: str, n_parts: int, rows: int) -> list[int]:
    if n_parts == 1:
        return [rows]
    if ".attn.qkv." in name:
        hd = config.head_dim
        return [config.n_heads * hd, config.kv_heads * hd, config.kv_heads * hd]
    return [rows // n_parts] * n_parts  # [gate | up]


def rows(
    config: GPTConfig, lamina_shapes: Mapping[str, tuple[int, ...]], family: Family, fmt: str
) -> list[Row]:
    """The rows for a model with these lamina tensors (a tied head left out) as `family` in
    format `fmt` ("hf" or "gguf")."""
    if fmt not in FORMATS:
        raise LaminaError(f"unknown tensor format {fmt!r}; choose from {', '.join(FORMATS)}")
    col = FORMATS.index(fmt)
    transforms = {
        "T": TRANSPOSE,
        "+1": PLUS_ONE,
        "Rq": rope_permutation(config.n_heads),
        "Rk": rope_permutation(config.kv_heads),
    }
    block = family.hf_block if fmt == "hf" else "blk.{i}."
    out = []
    for name, shape in lamina_shapes.items():
        if name == "head.weight" and config.tie_weights:
            continue
        head, _, rest = name.partition(".")
        if head == "blocks":
            i, _, inner = rest.partition(".")
            spec, prefix = family.block.get(inner, (None, None))[col], block.format(i=i)
        else:
            spec, prefix = family.top.get(name, (None, None))[col], ""
        if spec is None:
            raise LaminaError(
                f"lamina tensor {name} has no counterpart in the {family.title} {fmt} format"
            )
        pieces = [p.partition(":") for p in spec.split("|")]
        sizes = _split_rows(config, name, len(pieces), shape[0])
        parts = tuple(
            Part(prefix + base, n, transforms[kind] if kind else SAME)
            for (base, _, kind), n in zip(pieces, sizes, strict=True)
        )
        out.append(Row(name, tuple(shape), parts))
    return out


def lamina_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every stored tensor of a GPT of `config` and its shape (built on the meta device)."""
    with torch.device("meta"):
        return shapes_of(GPT(config))


def shapes_of(model: GPT) -> dict[str, tuple[int, ...]]:
    """Every stored tensor of `model` and its shape (a loader's meta model: built once)."""
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def foreign_shapes(family: Family, config: GPTConfig, fmt: str) -> dict[str, tuple[int, ...]]:
    """The foreign tensors (name -> shape) a file of `config` as `family` holds."""
    table = rows(config, lamina_shapes(config), family, fmt)
    return {p.foreign: s for r in table for p, s in zip(r.parts, r.foreign_shapes(), strict=True)}


def _listed(keys: list[str], limit: int = 8) -> str:
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    shown = [k if k.isprintable() and len(k) < 80 else repr(k[:80]) for k in keys[:limit]]
    return ", ".join(shown) + more


def check(
    table: list[Row], foreign_shapes: Mapping[str, tuple[int, ...]], where: str, implied: str
) -> None:
    """Refuse, in one line, foreign tensors missing, unexpected or not of the shape `implied`
    (e.g. "config.json") says: foreign_shapes holds every tensor the caller will not skip."""
    wanted = {p.foreign: s for r in table for p, s in zip(r.parts, r.foreign_shapes(), strict=True)}
    missing = [k for k in wanted if k not in foreign_shapes]
    unexpected = sorted(set(foreign_shapes) - set(wanted))
    if missing or unexpected:
        parts = [f"missing {_listed(missing)}"] if missing else []
        parts += [f"unexpected {_listed(unexpected)}"] if unexpected else []
        raise LaminaError(f"{where} does not match its {implied}: {'; '.join(parts)}")
    for name, want in wanted.items():
        got = tuple(foreign_shapes[name])
        if got != want:
            raise LaminaError(f"{where}: tensor {name} has shape {got}, {implied} implies {want}")


def lamina_tensor(row: Row, fetch: Callable[[str], Tensor]) -> Tensor:
    """One lamina tensor from its foreign parts (the row's transforms applied)."""
    if len(row.parts) == 1:
        return row.parts[0].transform.to_lamina(fetch(row.parts[0].foreign))
    first = fetch(row.parts[0].foreign)
    # parts stack along dim 0; the other dims are the fetched tensors' own (raw quantized
    # blocks have fewer columns than the values they hold)
    whole = torch.empty((row.shape[0], *first.shape[1:]), dtype=first.dtype)
    at = 0
    for i, p in enumerate(row.parts):  # each part written into its rows: no torch.cat
        piece = first if i == 0 else fetch(p.foreign)
        whole[at : at + p.rows] = p.transform.to_lamina(piece)
        at += p.rows
    return whole


def to_lamina(table: list[Row], fetch: Callable[[str], Tensor]) -> dict[str, Tensor]:
    """Lamina tensors from foreign ones (checked first with `check`)."""
    return {row.lamina: lamina_tensor(row, fetch) for row in table}


def to_foreign(table: list[Row], state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Foreign tensors (contiguous) from a lamina state dict."""
    out = {}
    for row in table:
        t = state[row.lamina]
        chunks = t.split([p.rows for p in row.parts]) if len(row.parts) > 1 else [t]
        for part, chunk in zip(row.parts, chunks, strict=True):
            out[part.foreign] = part.transform.to_foreign(chunk).contiguous()
    return out

"""One table of tensor names: lamina's GPT against HF GPT-2, HF Llama and GGUF, both directions.

    rows(config, lamina_shapes, fmt, **transform_args) -> list[Row]   the rows one model needs
    check(rows, foreign_shapes, where, ignore=...)    missing / unexpected / misshapen, one line
    to_lamina(rows, fetch) -> {lamina name: Tensor}   fetch(foreign name) -> Tensor
    to_foreign(rows, state) -> {foreign name: Tensor}

Formats (`FORMATS`): "hf-gpt2" (names inside `transformer.`; the caller strips or adds it),
"hf-llama", "gguf-gpt2", "gguf-llama" (llama.cpp's names; also qwen2's). A row is one lamina
tensor and the foreign tensors it is made of: several when lamina fuses what the other keeps
apart ([q | k | v] in `attn.qkv`, [gate | up] in `ff.fc`), stacked along dim 0. Each part has a
transform:
- "T": HF GPT-2's Conv1D stores (in, out), the transpose of nn.Linear's (out, in);
- "Rq" / "Rk": llama.cpp's converter permutes the rows of q (n_heads) and k (n_kv_heads) for
  its interleaved rotary layout (`LlamaModel.permute`: rows viewed as (heads, 2, hd / 2) and
  the last two axes swapped); lamina, like HF, pairs the two halves of each head. Only with
  `permute_rope=True` (GGUF llama; qwen2's converter does not permute).
The table covers a lamina GPT of either layout; which rows apply follows from the lamina
model's own tensor names (its `state_dict` on the meta device), and a lamina tensor with no
name in the format is refused. A tied head is not a row (it is the token table).
The GGUF reader and writer (gguf, gguf_write) go through it; the Hugging Face converters
(hf_gpt2, hf_llama) still keep their own lists, which a test holds equal to the hf columns
here (moving them onto this table is the next step). Deliberately unaware of files and of how
the foreign tensors are read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from lamina.errors import LaminaError
from lamina.models.config import GPTConfig

FORMATS = ("hf-gpt2", "hf-llama", "gguf-gpt2", "gguf-llama")

# lamina name inside blocks.{i} -> foreign names in (hf-gpt2 h.{i}, hf-llama model.layers.{i},
# gguf-gpt2 blk.{i}, gguf-llama blk.{i}); "a|b|c": parts stacked along dim 0; ":X" a transform
# fmt: off
_BLOCK: dict[str, tuple[str | None, ...]] = {
    "norm1.weight": ("ln_1.weight", "input_layernorm.weight", "attn_norm.weight", "attn_norm.weight"),
    "norm1.bias": ("ln_1.bias", None, "attn_norm.bias", None),
    "attn.qkv.weight": (
        "attn.c_attn.weight:T",
        "self_attn.q_proj.weight|self_attn.k_proj.weight|self_attn.v_proj.weight",
        "attn_qkv.weight",
        "attn_q.weight:Rq|attn_k.weight:Rk|attn_v.weight",
    ),
    "attn.qkv.bias": (
        "attn.c_attn.bias",
        "self_attn.q_proj.bias|self_attn.k_proj.bias|self_attn.v_proj.bias",
        "attn_qkv.bias",
        "attn_q.bias:Rq|attn_k.bias:Rk|attn_v.bias",
    ),
    "attn.proj.weight": ("attn.c_proj.weight:T", "self_attn.o_proj.weight", "attn_output.weight", "attn_output.weight"),
    "attn.proj.bias": ("attn.c_proj.bias", "self_attn.o_proj.bias", "attn_output.bias", "attn_output.bias"),
    "norm2.weight": ("ln_2.weight", "post_attention_layernorm.weight", "ffn_norm.weight", "ffn_norm.weight"),
    "norm2.bias": ("ln_2.bias", None, "ffn_norm.bias", None),
    "ff.fc.weight": ("mlp.c_fc.weight:T", "mlp.gate_proj.weight|mlp.up_proj.weight", "ffn_up.weight", "ffn_gate.weight|ffn_up.weight"),
    "ff.fc.bias": ("mlp.c_fc.bias", "mlp.gate_proj.bias|mlp.up_proj.bias", "ffn_up.bias", "ffn_gate.bias|ffn_up.bias"),
    "ff.proj.weight": ("mlp.c_proj.weight:T", "mlp.down_proj.weight", "ffn_down.weight", "ffn_down.weight"),
    "ff.proj.bias": ("mlp.c_proj.bias", "mlp.down_proj.bias", "ffn_down.bias", "ffn_down.bias"),
}
_TOP: dict[str, tuple[str | None, ...]] = {
    "embed.wte.weight": ("wte.weight", "model.embed_tokens.weight", "token_embd.weight", "token_embd.weight"),
    "embed.wpe.weight": ("wpe.weight", None, "position_embd.weight", None),
    "norm_f.weight": ("ln_f.weight", "model.norm.weight", "output_norm.weight", "output_norm.weight"),
    "norm_f.bias": ("ln_f.bias", None, "output_norm.bias", None),
    "head.weight": ("lm_head.weight", "lm_head.weight", "output.weight", "output.weight"),
}
_PREFIX = {"hf-gpt2": "h.{i}.", "hf-llama": "model.layers.{i}.", "gguf-gpt2": "blk.{i}.", "gguf-llama": "blk.{i}."}
# fmt: on


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


def rope_permutation(n_heads: int) -> Transform:
    """llama.cpp's q/k row order <-> HF's (and lamina's), for `n_heads` heads of rows."""

    def to_foreign(t: Tensor) -> Tensor:  # llama.cpp's LlamaModel.permute
        rows = t.shape[0]
        return (
            t.reshape(n_heads, 2, rows // n_heads // 2, *t.shape[1:])
            .transpose(1, 2)
            .reshape(t.shape)
        )

    def to_lamina(t: Tensor) -> Tensor:  # its inverse (transformers' _reverse_permute_weights)
        rows = t.shape[0]
        return (
            t.reshape(n_heads, rows // n_heads // 2, 2, *t.shape[1:])
            .transpose(1, 2)
            .reshape(t.shape)
        )

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


def _lookup(name: str, fmt: str) -> tuple[str | None, str]:
    """(foreign spec, prefix) of a lamina name in `fmt`; KeyError if the table lacks it."""
    col = FORMATS.index(fmt)
    head, _, rest = name.partition(".")
    if head == "blocks":
        i, _, inner = rest.partition(".")
        return _BLOCK[inner][col], _PREFIX[fmt].format(i=i)
    return _TOP[name][col], ""


def rows(
    config: GPTConfig,
    lamina_shapes: Mapping[str, tuple[int, ...]],
    fmt: str,
    *,
    permute_rope: bool = False,
) -> list[Row]:
    """The rows for a model with these lamina tensors (a tied head left out) in format `fmt`."""
    if fmt not in FORMATS:
        raise LaminaError(f"unknown tensor format {fmt!r}; choose from {', '.join(FORMATS)}")
    transforms = {"T": TRANSPOSE, "Rq": SAME, "Rk": SAME}
    if permute_rope:
        transforms |= {
            "Rq": rope_permutation(config.n_heads),
            "Rk": rope_permutation(config.kv_heads),
        }
    out = []
    for name, shape in lamina_shapes.items():
        if name == "head.weight" and config.tie_weights:
            continue
        try:
            spec, prefix = _lookup(name, fmt)
        except KeyError:
            spec, prefix = None, ""
        if spec is None:
            raise LaminaError(f"lamina tensor {name} has no counterpart in the {fmt} format")
        pieces = [p.partition(":") for p in spec.split("|")]
        sizes = _split_rows(config, name, len(pieces), shape[0])
        parts = tuple(
            Part(prefix + base, n, transforms[kind] if kind else SAME)
            for (base, _, kind), n in zip(pieces, sizes, strict=True)
        )
        out.append(Row(name, tuple(shape), parts))
    return out


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

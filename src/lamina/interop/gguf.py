"""GGUF models in and out: llama.cpp's files as lamina GPTs, and lamina GPTs as GGUF files.

    read_gguf(path) -> GGUFContents        header + memory-mapped tensors (see gguf_file)
    gguf_config(metadata, tensors=None) -> GPTConfig
    gguf_table(contents) -> (GPTConfig, rows)   which GGUF tensors make each lamina tensor, and
                                           how (tensor_map rows, checked against the file)
    load_gguf(path) -> (GPT, metadata)     an fp32 CPU model in eval mode, and the file's
                                           metadata (tokenizer.ggml.*, chat template, ...)
    save_gguf(model, path, tokenizer=None, qtype="f32" | "f16" | "q8_0") -> Path

Architectures: "llama" (Llama 1-3 without rope scaling, SmolLM, Mistral without sliding
windows: all written as llama), "qwen2" (a llama with q/k/v biases and no row permutation) and
"gpt2". Metadata `{arch}.context_length` -> block_size, `.embedding_length` -> d_model,
`.block_count` -> n_layers, `.feed_forward_length` -> d_ff, `.attention.head_count(_kv)` ->
n_heads / n_kv_heads, `.rope.freq_base` -> rope_theta, `.attention.layer_norm_rms_epsilon`
(`layer_norm_epsilon` for gpt2) -> layer_norm_eps; the vocabulary is the token table's rows.
Biases follow the tensors present. A missing `output.weight`, or one byte-equal to the token
table, is a tied head. llama's q/k rows are un-permuted (tensor_map's "Rq"/"Rk"). Refused in
one line naming it: another architecture, a `{arch}.*` key lamina does not know or cannot honour
(rope scaling, a head width or rotary width other than d_model / n_heads, experts, sliding
windows, soft-caps), a tensor type lamina cannot dequantize, missing/unexpected/misshapen
tensors. The model is built on the meta device and the dequantized tensors are assigned to it:
no random weights, no second copy.

Out: a rotary lamina GPT (Llama layout) is written as arch llama with the permutation applied
(qwen2 when it has biases on q, k, v only), a GPT-2-layout one as arch gpt2 (its head always written as `output.weight`, as llama.cpp's
converter does). qtype "f16" stores matrices in F16, "q8_0" in Q8_0 (where a row divides into
blocks of 32, else F16); norms and biases stay F32. A GPT-2 BPE tokenizer (kinds "gpt2" and
"bpe") is written as `tokenizer.ggml.*` (model "gpt2"). The file is written beside its name and
renamed into place. Deliberately unaware of the transformers and llama.cpp packages.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lamina.checkpoint import assign_state
from lamina.errors import LaminaError
from lamina.interop import tensor_map
from lamina.interop.gguf_file import DEQUANTIZABLE, GGUFContents, GGUFTensor, read_gguf, shown
from lamina.interop.gguf_write import save_gguf
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.quant.from_blocks import from_blocks, keepable
from lamina.quant.ggml import row_bytes

__all__ = [
    "GGUFContents", "GGUFTensor", "gguf_config", "gguf_table", "load_gguf", "read_gguf", "save_gguf",
]  # fmt: skip

ARCHS = ("llama", "qwen2", "gpt2")
# {arch}.* keys read into the config, and keys that change nothing lamina computes
_READ = {
    "context_length", "embedding_length", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "rope.freq_base",
    "attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "vocab_size",
    "rope.dimension_count", "attention.key_length", "attention.value_length",
}  # fmt: skip
_HARMLESS = {"tensor_data_layout", "attention.causal"}
_ZERO_OK = {"expert_count", "expert_used_count", "expert_shared_count"}  # present as 0: no experts
_NONE_OK = {"rope.scaling.type": ("none",), "rope.scaling.factor": (1.0, 0.0)}


def _arch(metadata: Mapping[str, Any], where: str) -> str:
    arch = metadata.get("general.architecture")
    if arch not in ARCHS:
        raise LaminaError(
            f"{where}: GGUF architecture {shown(repr(arch))} is not one lamina runs "
            f"(it runs {', '.join(ARCHS)})"
        )
    return arch


def _check_keys(metadata: Mapping[str, Any], arch: str, where: str) -> None:
    for key, value in metadata.items():
        if not key.startswith(arch + "."):
            continue
        k = key[len(arch) + 1 :]
        if k in _READ or k in _HARMLESS:
            continue
        if k in _ZERO_OK and value == 0:
            continue
        if k in _NONE_OK and value in _NONE_OK[k]:
            continue
        raise LaminaError(
            f"{where}: GGUF key {shown(key)} = {shown(repr(value))} is one lamina cannot honour"
        )


def _int(metadata: Mapping[str, Any], key: str, where: str, default: Any = None) -> int:
    value = metadata.get(key, default)
    if value is None:
        raise LaminaError(f"{where}: GGUF metadata lacks {key}")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise LaminaError(
            f"{where}: GGUF key {key} must be a positive integer, got {shown(repr(value))}"
        )
    return value


def _float(metadata: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise LaminaError(
            f"{where}: GGUF key {key} must be a positive number, got {shown(repr(value))}"
        )
    return float(value)


def _tied(tensors: Mapping[str, GGUFTensor]) -> bool:
    """A head absent, or stored as the very bytes of the token table."""
    head, table = tensors.get("output.weight"), tensors.get("token_embd.weight")
    if head is None:
        return True
    return (
        table is not None
        and head.qtype == table.qtype
        and head.shape == table.shape
        and np.array_equal(head.raw, table.raw)
    )


def gguf_config(
    metadata: Mapping[str, Any],
    tensors: Mapping[str, GGUFTensor] | None = None,
    where: str = "GGUF file",
) -> GPTConfig:
    """A GPTConfig from GGUF metadata; with the tensors, biases and the tie follow them (without,
    the architecture's usual: llama none, qwen2 on q/k/v, gpt2 everywhere; a tied head)."""
    arch = _arch(metadata, where)
    _check_keys(metadata, arch, where)
    a = arch + "."
    d, heads = (
        _int(metadata, a + "embedding_length", where),
        _int(metadata, a + "attention.head_count", where),
    )
    if d % heads:
        raise LaminaError(f"{where}: {a}embedding_length {d} is not divisible by {heads} heads")
    for key in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        if a + key in metadata and metadata[a + key] != d // heads:
            raise LaminaError(
                f"{where}: GGUF key {a}{key} = {metadata[a + key]!r}: lamina's heads and rotary "
                f"tables are embedding_length / head_count = {d // heads} wide"
            )
    names = set(tensors or ())
    if tensors and "token_embd.weight" in tensors:
        vocab = tensors["token_embd.weight"].shape[0]
    else:
        tokens = metadata.get("tokenizer.ggml.tokens")
        vocab = _int(
            metadata, a + "vocab_size", where, len(tokens) if isinstance(tokens, list) else None
        )
    if arch == "gpt2":
        layout: dict[str, Any] = dict(
            activation="gelu",
            layer_norm_eps=_float(metadata, a + "attention.layer_norm_epsilon", where, 1e-5),
        )
    else:
        layout = dict(
            n_kv_heads=_int(metadata, a + "attention.head_count_kv", where, heads),
            positions="rope", norm="rms", activation="swiglu",
            rope_theta=_float(metadata, a + "rope.freq_base", where, 10000.0),
            layer_norm_eps=_float(metadata, a + "attention.layer_norm_rms_epsilon", where, 1e-5),
            qkv_bias="blk.0.attn_q.bias" in names if tensors else arch == "qwen2",
            bias="blk.0.attn_output.bias" in names if tensors else False,
        )  # fmt: skip
    try:
        return GPTConfig(
            vocab_size=vocab, block_size=_int(metadata, a + "context_length", where),
            d_model=d, n_heads=heads, n_layers=_int(metadata, a + "block_count", where),
            d_ff=_int(metadata, a + "feed_forward_length", where, 4 * d),
            tie_weights=_tied(tensors) if tensors else True, **layout,
        )  # fmt: skip
    except (LaminaError, TypeError, ValueError) as e:
        raise LaminaError(f"{where}: {e}") from e


def _meta_gpt(config: GPTConfig) -> tuple[GPT, dict[str, tuple[int, ...]]]:
    with torch.device("meta"):
        model = GPT(config)
    return model, {k: tuple(v.shape) for k, v in model.state_dict().items()}


def gguf_table(contents: GGUFContents) -> tuple[GPTConfig, list[tensor_map.Row]]:
    """The config of a GGUF file and its checked tensor rows: for each lamina tensor, the GGUF
    tensors it is made of (stacked along dim 0) and their transforms. A row transform (the q/k
    permutation) moves whole rows, so it applies as well to a tensor's raw blocks
    (`torch.from_numpy(t.raw)`) as to its values: how a loader keeps weights quantized."""
    where = str(contents.path)
    tensors = contents.tensors
    config = gguf_config(contents.metadata, tensors, where)
    arch = contents.metadata["general.architecture"]
    _, shapes = _meta_gpt(config)
    fmt = "gguf-gpt2" if arch == "gpt2" else "gguf-llama"
    table = tensor_map.rows(config, shapes, fmt, permute_rope=arch == "llama")
    present = {n: t.shape for n, t in tensors.items()}
    if config.tie_weights:
        present.pop("output.weight", None)  # the token table's own bytes
    tensor_map.check(table, present, where, "metadata")
    return config, table


class _LazyState(Mapping[str, Tensor]):
    """lamina name -> tensor, each read from the file when asked for (not kept)."""

    def __init__(
        self,
        table: list[tensor_map.Row],
        fetch: Callable[[str], Tensor],
        before: Callable[[], None],
        apart: frozenset[str] = frozenset(),
    ) -> None:
        self._rows, self._fetch, self._before = {r.lamina: r for r in table}, fetch, before
        self._apart = apart  # names whose parts come as a list (blocks of different types)

    def __getitem__(self, name: str) -> Tensor | list[Tensor]:
        row = self._rows[name]  # KeyError for a name the table lacks, as a dict
        self._before()
        if name in self._apart:
            return [p.transform.to_lamina(self._fetch(p.foreign)) for p in row.parts]
        return tensor_map.lamina_tensor(row, self._fetch)

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


def load_gguf(
    path: str | os.PathLike[str], *, quantized: bool = False
) -> tuple[GPT, dict[str, Any]]:
    """A lamina GPT (fp32, CPU, eval) from a GGUF file, and the file's metadata; with
    `quantized`, Q4_0/Q4_1/Q8_0 weights stay quantized, exactly, and Q4_K/Q5_K/Q6_K/Q5_0/Q5_1
    ones as the file stores them (lamina.quant.from_blocks)."""
    contents = read_gguf(path)
    tensors = contents.tensors
    config, table = gguf_table(contents)
    for row in table:  # refuse an unreadable type before dequantizing anything
        for part in row.parts:
            if tensors[part.foreign].qtype not in DEQUANTIZABLE:
                tensors[part.foreign].dequantize()  # the one-line refusal naming tensor and type
    model, _ = _meta_gpt(config)
    if quantized:  # blocks lamina holds exactly stay quantized (lamina.quant.from_blocks)
        kept = keepable({r.lamina: [tensors[p.foreign] for p in r.parts] for r in table})
        raw = {p.foreign for r in table if r.lamina in kept for p in r.parts}

        def fetch(n: str) -> Tensor:
            t = tensors[n]
            return row_bytes(t.raw, t.qtype, t.shape) if n in raw else t.dequantize()

        # each tensor read from the file as from_blocks converts it, and the file's pages read
        # so far handed back first: the blocks are never all held at once (peak memory)
        apart = frozenset(n for n, q in kept.items() if isinstance(q, tuple) and len(set(q)) > 1)
        state = _LazyState(table, fetch, contents.drop_pages, apart)
        model = from_blocks(model, state, kept)
        contents.drop_pages()
        return model, dict(contents.metadata)
    state = tensor_map.to_lamina(table, lambda name: tensors[name].dequantize())
    assign_state(model, state, str(contents.path))
    return model.eval(), dict(contents.metadata)

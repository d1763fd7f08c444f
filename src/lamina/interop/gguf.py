"""GGUF models in and out: llama.cpp's files as lamina GPTs, and lamina GPTs as GGUF files.

    read_gguf(path) -> GGUFContents        header + memory-mapped tensors (see lamina.native.gguf_read)
    gguf_config(metadata, tensors=None) -> GPTConfig
    gguf_table(contents) -> (GPTConfig, rows)   which GGUF tensors make each lamina tensor, and
                                           how (tensor_map rows, checked against the file)
    load_gguf(path) -> (GPT, metadata)     an fp32 CPU model in eval mode, and the file's
                                           metadata (tokenizer.ggml.*, chat template, ...)
    save_gguf(model, path, tokenizer=None, qtype="f32" | "f16" | "q8_0") -> Path

Architectures: every family record with a GGUF form (`families`: gpt2, llama, qwen2, qwen3,
gemma2, gemma3, phi3; a llama file with a sliding window is read as Mistral). The metadata is
read by the record (`family_gguf`: keys, defaults, llama.cpp's hard-coded rules, rope scalings
stored as tensors); the vocabulary is the token table's rows. Biases follow the tensors present.
A missing `output.weight`, or one byte-equal to the token table, is a tied head. The tensor
names and transforms (llama's q/k row permutation, Gemma's norms stored plus one) are the
record's (`tensor_map`). Refused in one line naming it: another architecture, a `{arch}.` key
the family does not know or lamina cannot honour (yarn scaling, experts, ...), a tensor type
lamina cannot dequantize, missing/unexpected/misshapen tensors. The model is built on the meta
device and the dequantized tensors are assigned to it: no random weights, no second copy.

Out (`gguf_write`): the first family, in table order, that expresses the model; its rope
scaling as llama.cpp stores it (linear as keys, llama3 as `rope_freqs.weight`, longrope as
`rope_factors_long/short.weight`). qtype "f16" stores matrices in F16, "q8_0" in Q8_0 (where a
row divides into blocks of 32, else F16); norms and biases stay F32. A GPT-2 BPE tokenizer
(kinds "gpt2" and "bpe") is written as `tokenizer.ggml.*` (model "gpt2"). The file is written
beside its name and renamed into place. Deliberately unaware of the transformers and llama.cpp
packages.
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
from lamina.interop.family import Family
from lamina.interop.family_gguf import from_gguf
from lamina.interop.gguf_write import save_gguf
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.native.gguf_read import DEQUANTIZABLE, GGUFContents, GGUFTensor, read_gguf
from lamina.quant.from_blocks import from_blocks, keepable
from lamina.quant.ggml import row_bytes

__all__ = [
    "GGUFContents", "GGUFTensor", "gguf_config", "gguf_table", "load_gguf", "read_gguf", "save_gguf",
]  # fmt: skip


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


def _consult(
    metadata: Mapping[str, Any], tensors: Mapping[str, GGUFTensor] | None, where: str
) -> tuple[Family, GPTConfig, set[str]]:
    arch = metadata.get("general.architecture")
    present = {n: tuple(t.shape) for n, t in (tensors or {}).items()}
    tied = _tied(tensors) if tensors else True

    def fetch(name: str) -> np.ndarray:
        if tensors is None or name not in tensors:
            raise LaminaError(f"{where}: lacks the tensor {name}")
        return tensors[name].dequantize().numpy()

    return from_gguf(arch, metadata, present, tied, fetch, where)


def gguf_config(
    metadata: Mapping[str, Any],
    tensors: Mapping[str, GGUFTensor] | None = None,
    where: str = "GGUF file",
) -> GPTConfig:
    """A GPTConfig from GGUF metadata; with the tensors, biases, the tie and rope scalings stored
    as tensors follow them (without: no biases, a tied head)."""
    return _consult(metadata, tensors, where)[1]


def gguf_table(contents: GGUFContents) -> tuple[GPTConfig, list[tensor_map.Row]]:
    """The config of a GGUF file and its checked tensor rows: for each lamina tensor, the GGUF
    tensors it is made of (stacked along dim 0) and their transforms. A row transform (the q/k
    permutation) moves whole rows, so it applies as well to a tensor's raw blocks
    (`torch.from_numpy(t.raw)`) as to its values: how a loader keeps weights quantized."""
    config, table, _ = _table(contents)
    return config, table


def _table(contents: GGUFContents) -> tuple[GPTConfig, list[tensor_map.Row], GPT]:
    """gguf_table's config and rows, and the GPT on the meta device they were read from (the
    loader's model: built once)."""
    where = str(contents.path)
    tensors = contents.tensors
    family, config, consumed = _consult(contents.metadata, tensors, where)
    model = _meta_gpt(config)
    table = tensor_map.rows(config, tensor_map.shapes_of(model), family, "gguf")
    present = {n: t.shape for n, t in tensors.items() if n not in consumed}
    if config.tie_weights:
        present.pop("output.weight", None)  # the token table's own bytes
    tensor_map.check(table, present, where, "metadata")
    return config, table, model


def _meta_gpt(config: GPTConfig) -> GPT:
    with torch.device("meta"):
        return GPT(config)


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
    config, table, model = _table(contents)
    for row in table:  # refuse an unreadable type before dequantizing anything
        for part in row.parts:
            if tensors[part.foreign].qtype not in DEQUANTIZABLE:
                tensors[part.foreign].dequantize()  # the one-line refusal naming tensor and type
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

"""Lamina GPTs written as GGUF files that llama.cpp loads (re-exported by `lamina.interop.gguf`).

    save_gguf(model, path, tokenizer=None, qtype="f32" | "f16" | "q8_0") -> Path
    gguf_arch(config) -> str     the architecture a model is written as (refuses what none fits)

The model is written as the first family of the table (`families`) that expresses it exactly
(`family_gguf.expressing`: what is written reads back as the same config): its `{arch}.` keys
and rope-scaling tensors from `family_gguf.to_gguf`, its tensors under the record's names
(`tensor_map`; llama's q/k rows permuted as llama.cpp's converter does, Gemma's norm gains
stored plus one). A Mistral's window is written as `llama.attention.sliding_window`, which
llama.cpp does not read for arch llama: saving one warns (LaminaWarning). GPT-2's head is always stored as `output.weight` (llama.cpp's converter writes
it too). qtype "f16" stores 2-D tensors in F16; "q8_0" stores them in Q8_0 where a row divides
into blocks of 32 (else F16); 1-D tensors (norms, biases, rope factors) stay F32, as llama.cpp
expects. The tokenizer goes in as `tokenizer.ggml.*` where it can (see lamina.tokenizers.gguf_metadata); without
one, `tokenizer.ggml.model` is "none" (llama.cpp then runs token ids only). The file is written
beside its final name and renamed into place. Deliberately unaware of reading GGUF.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import lamina.quant as quant
from lamina.checkpoint import strip_compiled_prefix, unwrap
from lamina.errors import LaminaError, LaminaWarning
from lamina.files import atomic_write
from lamina.interop import tensor_map
from lamina.interop.family_gguf import expressing, to_gguf
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.native.gguf_read import _gguf
from lamina.tokenizers.gguf_metadata import gguf_tokenizer_metadata
from lamina.tokenizers.kinds import Tokenizer

QTYPES = ("f32", "f16", "q8_0")


def gguf_arch(config: GPTConfig) -> str:
    """The GGUF architecture `config` is written as; refuses a model no family expresses."""
    family = expressing(config, "gguf")
    return family.gguf_arch or family.name


def _add(writer: Any, key: str, value: Any) -> None:
    gguf = _gguf()
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list) and value and all(isinstance(v, bool) for v in value):
        writer.add_array(key, value)  # one bool per layer (sliding_window_pattern)
    elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)
    else:
        writer.add_array(key, value)


def _encode(name: str, array: np.ndarray, qtype: str) -> tuple[np.ndarray, Any]:
    """(bytes or floats, GGML type) of one tensor at the requested precision."""
    gguf = _gguf()
    Q = gguf.GGMLQuantizationType
    if array.ndim < 2 or qtype == "f32" or name == "position_embd.weight":
        return array.astype(np.float32), None
    if qtype == "q8_0" and array.shape[-1] % 32 == 0:
        return gguf.quants.quantize(array, Q.Q8_0), Q.Q8_0
    return array.astype(np.float16), None


def save_gguf(
    model: nn.Module,
    path: str | os.PathLike[str],
    tokenizer: Tokenizer | None = None,
    qtype: str = "f32",
) -> Path:
    """Write `model` (a lamina GPT) as a GGUF file llama.cpp loads; returns its path."""
    if qtype not in QTYPES:
        raise LaminaError(f"GGUF type must be one of {', '.join(QTYPES)}, got {qtype!r}")
    inner = unwrap(model)
    if not isinstance(inner, GPT):
        raise LaminaError(f"save_gguf needs a lamina GPT, got {type(inner).__name__}")
    scheme = quant.scheme_of(inner)
    if scheme is not None:
        raise LaminaError(
            f"save_gguf needs a float model; this one is quantized ({scheme['scheme']}): "
            "write the model before quantizing it (or use --type q8_0)"
        )
    config = inner.config
    family = expressing(config, "gguf")
    arch = family.gguf_arch or family.name
    window = config.sliding_window
    if arch == "llama" and window is not None and window < config.block_size:
        warnings.warn(
            f"llama.cpp reads no sliding window from arch llama: past sliding_window={window} "
            "tokens it attends over the whole context (lamina reads the window back from "
            f"{arch}.attention.sliding_window)",
            LaminaWarning,
            stacklevel=2,
        )
    tok_meta = gguf_tokenizer_metadata(tokenizer, config.vocab_size)
    state = {
        k: v.detach().float().cpu() for k, v in strip_compiled_prefix(inner.state_dict()).items()
    }
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    if arch == "gpt2":  # llama.cpp's gpt2 reads an output.weight: write the tied head too
        config = config.replace(tie_weights=False)
    table = tensor_map.rows(config, shapes, family, "gguf")
    meta, rope_tensors = to_gguf(family, config)
    tensors = tensor_map.to_foreign(table, state) | {
        n: torch.from_numpy(t) for n, t in rope_tensors.items()
    }
    out = Path(path)
    gguf = _gguf()
    writer = gguf.GGUFWriter(None, arch)
    writer.add_name(getattr(model, "name", None) or "lamina GPT")
    writer.add_file_type({"f32": 0, "f16": 1, "q8_0": 7}[qtype])
    for key, value in {**meta, **tok_meta}.items():
        _add(writer, key, value)
    if not tok_meta:
        writer.add_string("tokenizer.ggml.model", "none")
    for name, t in tensors.items():
        data, raw = _encode(name, t.numpy(), qtype)
        writer.add_tensor(name, data, raw_dtype=raw)

    def write(f: Any) -> None:  # the writer's one output is atomic_write's file
        writer.fout, writer.state = [f], gguf.gguf_writer.WriterState.EMPTY
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.flush()

    atomic_write(out, write, seekable=True)  # a FIFO refused; a link written through
    return out

"""Lamina GPTs written as GGUF files that llama.cpp loads (re-exported by `lamina.interop.gguf`).

    save_gguf(model, path, tokenizer=None, qtype="f32" | "f16" | "q8_0") -> Path
    gguf_arch(config) -> "llama" | "qwen2" | "gpt2"

A rotary lamina GPT (the Llama layout, as `hf_llama_config` accepts it) becomes arch "llama",
its q/k rows permuted as llama.cpp's converter does, or "qwen2" when it has biases on q, k and v
only (qwen2 keeps HF's row order); a GPT-2-layout one becomes arch "gpt2",
its head always stored as `output.weight` (llama.cpp's own converter writes it too). qtype
"f16" stores 2-D tensors in F16; "q8_0" stores them in Q8_0 where a row divides into blocks of
32 (else F16); 1-D tensors (norms, biases) stay F32, as llama.cpp expects. The tokenizer goes
in as `tokenizer.ggml.*` where it can (see lamina.tokenizers.gguf_metadata); without one, `tokenizer.ggml.model`
is "none" (llama.cpp then runs token ids only). The file is written
beside its final name and renamed into place. Deliberately unaware of reading GGUF.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

import lamina.quant as quant
from lamina.checkpoint import strip_compiled_prefix, unwrap
from lamina.errors import LaminaError
from lamina.files import atomic_write
from lamina.interop import tensor_map
from lamina.interop.gguf_file import _gguf
from lamina.interop.hf_gpt2 import hf_config
from lamina.interop.hf_llama import hf_llama_config
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.tokenizers.gguf_metadata import gguf_tokenizer_metadata
from lamina.tokenizers.kinds import Tokenizer

QTYPES = ("f32", "f16", "q8_0")


def gguf_arch(config: GPTConfig) -> str:
    """The GGUF architecture of a GPT: llama, qwen2 (a llama with biases on q, k, v only) or
    gpt2; refuses any model GGUF cannot express, naming the setting."""
    qwen2 = config.positions == "rope" and config.qkv_bias and not config.bias
    try:
        if config.positions == "rope":
            hf_llama_config(config.replace(bias=True) if qwen2 else config)
        else:
            hf_config(config)
    except LaminaError as e:
        raise LaminaError(str(e).replace("Hugging Face", "GGUF")) from None
    if config.positions != "rope" and config.activation != "gelu":
        raise LaminaError(f"cannot save as GGUF: activation={config.activation!r}: gpt2 is gelu")
    return "gpt2" if config.positions != "rope" else "qwen2" if qwen2 else "llama"


def _metadata(config: GPTConfig, arch: str) -> dict[str, Any]:
    a = arch + "."
    meta: dict[str, Any] = {
        a + "context_length": config.block_size,
        a + "embedding_length": config.d_model,
        a + "block_count": config.n_layers,
        a + "feed_forward_length": config.ff_width,
        a + "attention.head_count": config.n_heads,
        a + "vocab_size": config.vocab_size,
    }
    if arch == "gpt2":
        return meta | {a + "attention.layer_norm_epsilon": float(config.layer_norm_eps)}
    return meta | {
        a + "attention.head_count_kv": config.kv_heads,
        a + "rope.freq_base": float(config.rope_theta),
        a + "rope.dimension_count": config.head_dim,
        a + "attention.layer_norm_rms_epsilon": float(config.layer_norm_eps),
    }


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
    arch = gguf_arch(config)
    tok_meta = gguf_tokenizer_metadata(tokenizer, config.vocab_size)
    state = {
        k: v.detach().float().cpu() for k, v in strip_compiled_prefix(inner.state_dict()).items()
    }
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    if arch == "gpt2":  # llama.cpp's gpt2 reads an output.weight: write the tied head too
        config = config.replace(tie_weights=False)
    fmt = "gguf-gpt2" if arch == "gpt2" else "gguf-llama"
    table = tensor_map.rows(config, shapes, fmt, permute_rope=arch == "llama")
    tensors = tensor_map.to_foreign(table, state)
    out = Path(path)
    gguf = _gguf()
    writer = gguf.GGUFWriter(None, arch)
    writer.add_name(getattr(model, "name", None) or "lamina GPT")
    writer.add_file_type({"f32": 0, "f16": 1, "q8_0": 7}[qtype])
    for key, value in {**_metadata(config, arch), **tok_meta}.items():
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

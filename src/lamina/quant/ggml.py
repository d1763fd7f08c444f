"""GGML's quantized blocks (as GGUF files hold them) -> lamina's quantized tensors, exactly.

    blocks_to_int8(raw, qtype, shape) -> q int8 (N, K), scale float32 (N, K // 32)   # Q8_0
    blocks_to_int4(raw, qtype, shape) -> nibbles uint8 (N, K // 2), scales_and_zeros (K // 32, N, 2)
    BLOCK_QTYPES: the qtype names converted (Q8_0 -> int8; Q4_0, Q4_1 -> int4)

The conversions themselves are numpy's, in lamina.native.ggml_blocks (the torch-free runtime
uses them too; a test checks them against gguf.quants); here they become tensors.

Deliberately unaware of files, tensor names and modules: bytes in, tensors out.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lamina.errors import LaminaError
from lamina.native.ggml_blocks import BLOCK_BYTES, GROUP, blocks_of, int4_rows, int8_rows
from lamina.quant.kquant import KEPT, row_width

BLOCK_QTYPES = tuple(BLOCK_BYTES)


def _t(a: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def blocks_to_int8(raw: Any, qtype: str, shape: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Q8_0 bytes -> (q int8 (N, K), scale float32 (N, K // 32)): w = q * scale per group."""
    if qtype != "Q8_0":
        raise LaminaError(f"only Q8_0 converts to int8, got {qtype!r}")
    q, scale = int8_rows(raw, shape)
    return _t(q), _t(scale)


def blocks_to_int4(raw: Any, qtype: str, shape: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Q4_0 / Q4_1 bytes -> lamina int4 with group size 32 (see quant.quantize_int4's layout)."""
    nibbles, d, zero = int4_rows(raw, qtype, shape)
    sz = torch.stack([_t(d), _t(zero)], -1).transpose(0, 1).contiguous()  # (K // 32, N, 2)
    return _t(nibbles), sz


def row_bytes(raw: Any, qtype: str, shape: tuple[int, int]) -> Tensor:
    """A quantized tensor's bytes as (N, bytes per row) uint8: each row its own blocks (of 32,
    or the K-quants' super-blocks of 256; any qtype of BLOCK_QTYPES or kquant.KEPT).

    Row operations (reordering, concatenating tensors of one qtype) are exact on this form, so a
    loader can apply its row transforms (llama's q/k permutation, fused qkv) before converting.
    """
    n, k = shape
    if qtype in KEPT and qtype not in BLOCK_BYTES:
        data = np.ascontiguousarray(np.asarray(raw)).view(np.uint8).reshape(-1)
        if data.size != n * row_width(qtype, k):
            raise LaminaError(f"{qtype} tensor of shape {shape} has {data.size} bytes")
        rows = data.reshape(n, -1)
    else:
        rows = blocks_of(raw, qtype, shape).reshape(n, -1)
    with warnings.catch_warnings():  # a read-only view (a file's map): no copy, never written
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(rows)


def dequantize_rows(rows: Tensor, qtype: str, width: int) -> Tensor:
    """(N, bytes per row) of `qtype` -> float32 (N, width), GGML's values exactly."""
    shape = (rows.shape[0], width)
    if qtype == "Q8_0":
        q, scale = blocks_to_int8(rows.numpy(), qtype, shape)
        return (q.float().unflatten(1, (-1, GROUP)) * scale[..., None]).flatten(1)
    nibbles, sz = blocks_to_int4(rows.numpy(), qtype, shape)
    q = torch.stack([nibbles & 15, nibbles >> 4], -1).reshape(shape).float()
    s, z = sz.transpose(0, 1).unbind(-1)
    return ((q.unflatten(1, (-1, GROUP)) - 8) * s[..., None] + z[..., None]).flatten(1)

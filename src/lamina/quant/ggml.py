"""GGML's quantized blocks (as GGUF files hold them) -> lamina's quantized tensors, exactly.

    blocks_to_int8(raw, qtype, shape) -> q int8 (N, K), scale float32 (N, K // 32)   # Q8_0
    blocks_to_int4(raw, qtype, shape) -> nibbles uint8 (N, K // 2), scales_and_zeros (K // 32, N, 2)
    BLOCK_QTYPES: the qtype names converted (Q8_0 -> int8; Q4_0, Q4_1 -> int4)

`raw` is the tensor's bytes as stored (uint8, any shape that flattens to N * K/32 blocks), `shape`
its (N, K) in torch order (rows first; each row is K/32 blocks of 32 consecutive weights).
A block of 32 weights holds an fp16 scale d (and, for Q4_1, an fp16 minimum m), then:
    Q8_0: 32 int8 q,  w = q * d
    Q4_0: 16 bytes, low nibbles the first 16 weights, high nibbles the last 16,  w = (q - 8) * d
    Q4_1: as Q4_0,  w = q * d + m
lamina's int4 is w = (q - 8) * s + z with q in [0, 15]: Q4_0 is s = d, z = 0, and Q4_1 is s = d,
z = m + 8 d (fp16 values, whose sum fp32 holds exactly), so every weight dequantizes to the very
float GGML's own dequantization gives (a test checks it against gguf.quants).

Deliberately unaware of files, tensor names and modules: bytes in, tensors out.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lamina.errors import LaminaError
from lamina.quant.kquant import KEPT, row_width

GROUP = 32
_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
BLOCK_QTYPES = tuple(_BLOCK_BYTES)


def _blocks(raw: Any, qtype: str, shape: tuple[int, int]) -> np.ndarray:
    """The bytes as (N * K / 32, bytes per block), checked against the shape."""
    if qtype not in _BLOCK_BYTES:
        raise LaminaError(f"no exact lamina form for GGML type {qtype!r}; one of {BLOCK_QTYPES}")
    n, k = shape
    if k % GROUP:
        raise LaminaError(f"{qtype} rows must hold whole blocks of {GROUP}, got width {k}")
    data = np.ascontiguousarray(np.asarray(raw)).view(np.uint8).reshape(-1)
    want = n * (k // GROUP) * _BLOCK_BYTES[qtype]
    if data.size != want:
        raise LaminaError(f"{qtype} tensor of shape {shape} needs {want} bytes, got {data.size}")
    return data.reshape(n * (k // GROUP), _BLOCK_BYTES[qtype])


def _f16(col: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(col).view(np.float16).astype(np.float32))


def blocks_to_int8(raw: Any, qtype: str, shape: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Q8_0 bytes -> (q int8 (N, K), scale float32 (N, K // 32)): w = q * scale per group."""
    if qtype != "Q8_0":
        raise LaminaError(f"only Q8_0 converts to int8, got {qtype!r}")
    b = _blocks(raw, qtype, shape)
    n, k = shape
    scale = _f16(b[:, :2]).reshape(n, k // GROUP)
    q = torch.from_numpy(np.ascontiguousarray(b[:, 2:]).view(np.int8)).reshape(n, k)
    return q, scale


def blocks_to_int4(raw: Any, qtype: str, shape: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """Q4_0 / Q4_1 bytes -> lamina int4 with group size 32 (see quant.quantize_int4's layout)."""
    if qtype not in ("Q4_0", "Q4_1"):
        raise LaminaError(f"only Q4_0 and Q4_1 convert to int4, got {qtype!r}")
    b = _blocks(raw, qtype, shape)
    n, k = shape
    d = _f16(b[:, :2]).reshape(n, k // GROUP)
    if qtype == "Q4_1":
        zero = _f16(b[:, 2:4]).reshape(n, k // GROUP) + 8 * d
        qs = b[:, 4:]
    else:
        zero, qs = torch.zeros_like(d), b[:, 2:]
    qs = torch.from_numpy(np.ascontiguousarray(qs))  # (blocks, 16)
    q = torch.cat([qs & 15, qs >> 4], 1).reshape(n, k)  # weights in order, one per byte
    nibbles = q[:, 0::2] | (q[:, 1::2] << 4)  # lamina's layout: low nibble first
    sz = torch.stack([d, zero], -1).transpose(0, 1).contiguous()  # (K // 32, N, 2)
    return nibbles, sz


def row_bytes(raw: Any, qtype: str, shape: tuple[int, int]) -> Tensor:
    """A quantized tensor's bytes as (N, bytes per row) uint8: each row its own blocks (of 32,
    or the K-quants' super-blocks of 256; any qtype of BLOCK_QTYPES or kquant.KEPT).

    Row operations (reordering, concatenating tensors of one qtype) are exact on this form, so a
    loader can apply its row transforms (llama's q/k permutation, fused qkv) before converting.
    """
    n, k = shape
    if qtype in KEPT and qtype not in _BLOCK_BYTES:
        data = np.ascontiguousarray(np.asarray(raw)).view(np.uint8).reshape(-1)
        if data.size != n * row_width(qtype, k):
            raise LaminaError(f"{qtype} tensor of shape {shape} has {data.size} bytes")
        rows = data.reshape(n, -1)
    else:
        rows = _blocks(raw, qtype, shape).reshape(n, -1)
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

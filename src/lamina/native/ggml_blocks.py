"""GGML's blocks of 32 (as GGUF files hold them) -> lamina's int8 and int4 rows, in numpy, exactly.

    blocks_of(raw, qtype, shape) -> (N * K / 32, bytes per block) uint8, checked
    int8_rows(raw, shape) -> q int8 (N, K), scale float32 (N, K / 32)           # Q8_0
    int4_rows(raw, qtype, shape) -> nibbles uint8 (N, K / 2), scale, zero float32 (N, K / 32)
    BLOCK_BYTES: the qtypes converted (Q8_0 -> int8; Q4_0, Q4_1 -> int4) and their block size
    rope_halves(a, heads) / rope_pairs(a, heads): q/k rows, llama.cpp's order <-> lamina's

`raw` is the tensor's bytes as stored (uint8, any shape that flattens to N * K/32 blocks), `shape`
its (N, K) in torch order (rows first; each row is K/32 blocks of 32 consecutive weights).
A block of 32 weights holds an fp16 scale d (and, for Q4_1, an fp16 minimum m), then:
    Q8_0: 32 int8 q,  w = q * d
    Q4_0: 16 bytes, low nibbles the first 16 weights, high nibbles the last 16,  w = (q - 8) * d
    Q4_1: as Q4_0,  w = q * d + m
lamina's int4 is w = (q - 8) * s + z with q in [0, 15], nibbles low first (weight 2j low, 2j + 1
high): Q4_0 is s = d, z = 0, and Q4_1 is s = d, z = m + 8 d (fp16 values, whose sum fp32 holds
exactly), so every weight dequantizes to the very float GGML's own dequantization gives.
lamina.quant.ggml wraps these as tensors for the torch models; the torch-free runtime
(runtime.py) hands them to decode.c as they are.

Deliberately unaware of torch, files, tensor names and modules: bytes in, arrays out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lamina.errors import LaminaError

GROUP = 32
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}


def blocks_of(raw: Any, qtype: str, shape: tuple[int, int]) -> np.ndarray:
    """The bytes as (N * K / 32, bytes per block), checked against the shape (a view where
    `raw` is contiguous)."""
    if qtype not in BLOCK_BYTES:
        raise LaminaError(
            f"no exact lamina form for GGML type {qtype!r}; one of {tuple(BLOCK_BYTES)}"
        )
    n, k = shape
    if k % GROUP:
        raise LaminaError(f"{qtype} rows must hold whole blocks of {GROUP}, got width {k}")
    data = np.ascontiguousarray(np.asarray(raw)).view(np.uint8).reshape(-1)
    want = n * (k // GROUP) * BLOCK_BYTES[qtype]
    if data.size != want:
        raise LaminaError(f"{qtype} tensor of shape {shape} needs {want} bytes, got {data.size}")
    return data.reshape(n * (k // GROUP), BLOCK_BYTES[qtype])


def _f16(col: np.ndarray, n: int) -> np.ndarray:
    return np.ascontiguousarray(col).view(np.float16).astype(np.float32).reshape(n, -1)


def int8_rows(raw: Any, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 bytes -> (q int8 (N, K), scale float32 (N, K // 32)): w = q * scale per group."""
    b = blocks_of(raw, "Q8_0", shape)
    n, k = shape
    return np.ascontiguousarray(b[:, 2:]).view(np.int8).reshape(n, k), _f16(b[:, :2], n)


def int4_rows(raw: Any, qtype: str, shape: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """Q4_0 / Q4_1 bytes -> lamina's int4 with group size 32: nibbles uint8 (N, K // 2) and
    scale, zero float32 (N, K // 32), w = (q - 8) scale + zero."""
    if qtype not in ("Q4_0", "Q4_1"):
        raise LaminaError(f"only Q4_0 and Q4_1 convert to int4, got {qtype!r}")
    b = blocks_of(raw, qtype, shape)
    n, k = shape
    d = _f16(b[:, :2], n)
    if qtype == "Q4_1":
        zero, qs = _f16(b[:, 2:4], n) + 8 * d, b[:, 4:]
    else:
        zero, qs = np.zeros_like(d), b[:, 2:]
    # GGML's block: byte j holds weights j (low) and j + 16 (high); lamina's: 2j and 2j + 1
    low, high = qs & 15, qs >> 4  # (blocks, 16) each: weights 0..15 and 16..31
    q = np.concatenate([low, high], 1).reshape(n, k)
    return q[:, 0::2] | (q[:, 1::2] << 4), d, zero


def rope_halves(a: Any, heads: int) -> Any:
    """q or k rows in llama.cpp's interleaved rotary order (each head's rows in pairs) -> the
    halves order of lamina and HF (transformers' _reverse_permute_weights); a numpy array or a
    torch tensor (its methods alike), rows first, returned as a new contiguous one."""
    rows = a.shape[0]
    return a.reshape(heads, rows // heads // 2, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)


def rope_pairs(a: Any, heads: int) -> Any:
    """rope_halves' inverse (llama.cpp's LlamaModel.permute): halves -> interleaved pairs."""
    rows = a.shape[0]
    return a.reshape(heads, 2, rows // heads // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)

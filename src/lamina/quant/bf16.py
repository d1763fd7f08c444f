"""A prefill's weights in bf16, made by lamina.native's dequantizers into one reused buffer.

    native_bf16(linear) -> its W in bf16 in this thread's buffer, or None (native does not run
                           here, or not on this kind of linear: GGML blocks and int8 only)
    bf16_scratch(rows, cols) -> a bf16 (rows, cols) view of that buffer
    dequantized_matmul(linear, x) -> x @ W.T through the dequantized weights (the quantized
                           layers' path for calls their kernels do not take; see there)

A call of more than lamina.cpu.MAX_ROWS rows multiplies dequantized weights in bf16 where bf16
is native (lamina.cpu.dequantized_dtype). The native dequantizers write bf16 themselves, on
torch's threads (decode.c lm_dequant_bf16 for GGML's blocks, lm_dequant_i8_bf16 for lamina's
int8 rows), each value exactly what the float path's cast gives (tests/test_kquant.py,
tests/test_quant.py), and into one buffer reused call to call: a fresh tensor each call paid
for its pages anew. The buffer stays at the largest linear's size; the next call overwrites it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import lamina.cpu as cpu
from lamina.frozen_linear import dequantized as kept_dequantized
from lamina.frozen_linear import keeping, thread_buffer
from lamina.native.build import library
from lamina.quant.int8mm import int8_matmul


def bf16_scratch(rows: int, cols: int) -> Tensor:
    """A bf16 (rows, cols) view of this thread's one buffer for a prefill's weights (the
    buffer frozen_linear keeps a thread's dequantized weights in, under its own role)."""
    return thread_buffer("prefill-bf16", (rows, cols), torch.bfloat16, "cpu")


def int8_bf16(m: Any) -> Tensor | None:
    """An Int8Linear's W in bf16 in bf16_scratch (each value its float dequantization's bf16
    product: the scale's bf16 times q, rounded once), or None where native does not run."""
    lib = library()
    if lib is None or m.scale.dtype != torch.float32 or m.qweight.device.type != "cpu":
        return None
    q, scale = m.qweight.contiguous(), m.scale.contiguous()
    n, k = m.out_features, m.in_features
    w = bf16_scratch(n, k)
    gs, threads = m.group_size or k, torch.get_num_threads()
    ok = lib.lm_dequant_i8_bf16(q.data_ptr(), scale.data_ptr(), n, k, gs, w.data_ptr(), threads)
    return w if ok else None


def native_bf16(m: Any) -> Tensor | None:
    """m's W in bf16 in bf16_scratch where a native dequantizer reads m's layout (GGML's blocks,
    lamina's int8 rows), else None."""
    kind = getattr(m, "native_kind", None)
    if kind == "int8":
        return int8_bf16(m)
    if kind == "ggml" and library() is not None:
        return m.dequantized(torch.bfloat16, bf16_scratch(m.out_features, m.in_features))
    return None


def dequantized_matmul(m: Any, flat: Tensor) -> Tensor:
    """flat (M, in) @ W.T in flat's dtype, with m's weights dequantized in the dtype that
    lamina.cpu.dequantized_dtype picks: bf16 for a prefill where bf16 is native (made natively
    into one reused buffer where lamina.native reads m: above), else m.dequantized(dtype)
    into kept buffers inside frozen_linear.kept_dequantization (`lamina train`) or a new tensor.
    A call lamina.cpu.prefill_int8 picks multiplies int8 by int8 instead (quant/int8mm.py), where
    that reads m, outside kept_dequantization (`lamina train`)."""
    if cpu.prefill_int8(flat) and not keeping():
        y = int8_matmul(m, flat.float())
        if y is not None:
            return y.to(flat.dtype)
    dtype = cpu.dequantized_dtype(flat)
    w = native_bf16(m) if dtype == torch.bfloat16 else None
    return (flat.to(dtype) @ (kept_dequantized(m, dtype) if w is None else w).T).to(flat.dtype)

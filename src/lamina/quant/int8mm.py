"""A prefill's linears as int8 x int8 matmuls (torch._int_mm: AVX-512 VNNI), made natively.

    int8_matmul(linear, x) -> x (M, K) float32 @ W.T (no bias), or None where native does not
                              read this kind of linear (GGML blocks, lamina's int8 and int4 rows)
    int8_weights(linear, c=None) -> (W c int8 (N, K), a scale per row (N,)) in this thread's
                              buffers, or None: W (times c per input column) rounded per row
    weight_columns(linear, cols) -> W[:, cols] float32 (N, len(cols)), rounded per row over them
    column_maxima(x) -> max |x| per column; smoothing(x, w_max, x_max=None) -> c per column
    SMOOTH: the smoothing exponent (alpha) below; OUTLIERS: columns per call done in float

A call lamina.cpu.prefill_int8 picks (a prefill's long calls, where the CPU has VNNI, when
LAMINA_PREFILL_INT8=1 or lamina.cpu.int8_prefill(True); off by default) runs here instead of in
bf16 (quant/bf16.py). The input's rows are rounded to int8 with a scale each, the weights' rows
too (made per call into one reused buffer, as bf16.py's: no kept copy), and the int32 products
scaled back (decode.c "a prefill's linears in int8"). The input is smoothed first (SmoothQuant:
input column i divided by c_i = max|x_i|^SMOOTH / max|W_i|^(1 - SMOOTH), the weights' column
multiplied by it, the product unchanged), which moves the input's outlier channels into the
weights; the weights' column maxima are kept per linear (K floats), made on its first such call.
Then the OUTLIERS input columns largest after smoothing are taken out of both int8 operands
(LLM.int8's split) and multiplied in float32 (x[:, cols] @ W[:, cols].T, those weight columns
rounded to int8 per row over themselves only: a second pass over the weights), added to the
scaled int32 products: the loss over fp32 about halves, and the prefill loses 10-25% of its gain.
Each linear's output stays further from the float product than bf16's, and further than
llama.cpp's Q8 blocks leave theirs (one scale per row against one per 32): BENCHMARKS.md has
the loss, the logits and the speed, and why this is not the default.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lamina.frozen_linear import thread_buffer
from lamina.native.build import library
from lamina.native.structs import GGML_KINDS, LIN_INT4, LIN_INT8

SMOOTH = 0.5  # alpha: the lowest loss of 0.5 .. 0.8 over three SmolLM2 files (BENCHMARKS.md)
FLOOR = 1e-5  # column maxima below this count as this (an all-zero column)


def _parts(m: Any) -> list[tuple[int, Tensor, Tensor | None, Tensor | None, int, int]] | None:
    """m's rows as decode.c's kinds: [(kind, rows, scale, minimum, n, group size), ...], or None
    where lm_dequant_i8 does not read m (another kind, int4 in lanes, not float32 scales)."""
    kind = getattr(m, "native_kind", None)
    if kind == "ggml":
        return [(GGML_KINDS[q], r.contiguous(), None, None, r.shape[0], 0) for q, r in m.parts]
    if kind == "int8" and m.scale.dtype == torch.float32:
        scale = m.scale.contiguous().reshape(m.out_features, -1)
        gs = m.group_size or m.in_features
        return [(LIN_INT8, m.qweight.contiguous(), scale, None, m.out_features, gs)]
    if kind == "int4" and m.qweight is not None and m.native_scale is not None:
        s, low = m.native_scale.contiguous(), m.native_min.contiguous()
        return [(LIN_INT4, m.qweight.contiguous(), s, low, m.out_features, m.group_size)]
    return None


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _column_maxima(m: Any, parts: list) -> Tensor | None:
    """max |W| per input column (K,), made once and kept on m (`_int8_colmax`)."""
    kept = getattr(m, "_int8_colmax", None)
    if kept is not None:
        return kept
    lib, k, threads = library(), m.in_features, torch.get_num_threads()
    out, part = torch.zeros(k), torch.empty(k)
    for kind, rows, scale, low, n, gs in parts:
        if not lib.lm_colmax_i8(
            kind, rows.data_ptr(), _ptr(scale), _ptr(low), n, k, gs, part.data_ptr(), threads
        ):
            return None
        torch.maximum(out, part, out=out)
    m.__dict__["_int8_colmax"] = out  # not a buffer: never saved, never moved
    return out


def int8_weights(m: Any, c: Tensor | None = None) -> tuple[Tensor, Tensor] | None:
    """m's W (times c[i] in input column i, where given) rounded to int8 per output row, in this
    thread's buffers: (q int8 (N, K), scale float32 (N,)), q * scale[:, None] ~ W c; None where
    native does not run here or does not read m."""
    parts = _parts(m) if library() is not None else None
    if parts is None:
        return None
    lib, n, k, threads = library(), m.out_features, m.in_features, torch.get_num_threads()
    q = thread_buffer("prefill-i8", (n, k), torch.int8, "cpu")
    scale = thread_buffer("prefill-i8-scale", (1, n), torch.float32, "cpu")[0]
    first = 0
    for kind, rows, s, low, rn, gs in parts:
        if not lib.lm_dequant_i8(
            kind, rows.data_ptr(), _ptr(s), _ptr(low), rn, k, gs, _ptr(c),
            q[first:].data_ptr(), scale[first:].data_ptr(), threads,
        ):  # fmt: skip
            return None
        first += rn
    return q, scale


def column_maxima(x: Tensor) -> Tensor:
    """max |x| per column (K,) of x (M, K) float32, natively."""
    x_max = torch.empty(x.shape[1])
    library().lm_colmax(
        x.data_ptr(), x.shape[0], x.shape[1], x_max.data_ptr(), torch.get_num_threads()
    )
    return x_max


def smoothing(x: Tensor, w_max: Tensor, x_max: Tensor | None = None) -> Tensor:
    """The columns' multipliers c (K,) for input rows x (M, K) and the weights' column maxima."""
    x_max = column_maxima(x) if x_max is None else x_max.clone()
    return x_max.clamp_(min=FLOOR).pow_(SMOOTH).div_(w_max.clamp(min=FLOOR).pow_(1 - SMOOTH))


OUTLIERS = 16  # input columns per call taken out of the int8 product (the largest smoothed)


def weight_columns(m: Any, cols: Tensor) -> Tensor | None:
    """W[:, cols] (N, len(cols)) float32, rounded to int8 per row over these columns only
    (int8_weights with every other column times 0: one pass over the weights, no float copy of
    them), or None where int8_weights would be."""
    mask = torch.zeros(m.in_features)
    mask[cols] = 1.0
    w = int8_weights(m, mask)
    return None if w is None else w[0][:, cols].float().mul_(w[1][:, None])


def int8_matmul(m: Any, x: Tensor) -> Tensor | None:
    """x (M, K) float32 @ W.T (M, N) float32 through int8 (see the module), or None where
    int8_weights would be None (the caller runs another path)."""
    parts = _parts(m) if library() is not None else None
    w_max = None if parts is None else _column_maxima(m, parts)
    if w_max is None:
        return None
    lib, threads = library(), torch.get_num_threads()
    x = x.contiguous()
    rows, k = x.shape
    x_max = column_maxima(x)
    c = smoothing(x, w_max, x_max)
    cinv = torch.reciprocal(c)
    cols = None
    if min(OUTLIERS, k // 4) > 0:  # the largest smoothed columns: out of both int8 operands
        cols = (x_max * cinv).topk(min(OUTLIERS, k // 4)).indices
        cinv[cols] = 0.0
        c[cols] = 0.0
    w_cols = None if cols is None else weight_columns(m, cols)  # before int8_weights' buffer
    qx = thread_buffer("prefill-i8-input", (rows, k), torch.int8, "cpu")
    sx = torch.empty(rows)
    if not lib.lm_quant_rows_i8(
        x.data_ptr(), rows, k, cinv.data_ptr(), qx.data_ptr(), sx.data_ptr(), threads
    ):
        return None
    w = int8_weights(m, c)
    if w is None:
        return None
    qw, sw = w
    acc = torch._int_mm(qx, qw.t())  # (M, N) int32, a new tensor: scaled in place into floats
    y = acc.view(torch.float32)
    if not lib.lm_i8_scale(
        acc.data_ptr(), sx.data_ptr(), sw.data_ptr(), None, rows, m.out_features,
        y.data_ptr(), threads,
    ):  # fmt: skip
        return None
    if w_cols is not None:  # the outlier columns' part of the product, in float32
        y.addmm_(x[:, cols], w_cols.t())
    return y

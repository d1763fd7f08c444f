"""A prefill's linears as int8 x int8 matmuls (torch._int_mm: AVX-512 VNNI), made natively.

    int8_matmul(linear, x) -> x (M, K) float32 @ W.T (no bias), or None where native does not
                              read this kind of linear (GGML blocks, lamina's int8 and int4 rows)
                              or its role stays in bf16 (the head)
    int8_weights(linear, c=None, cols=None, rows=None) -> (W c int8 (N, K), a scale per row (N,),
                              W's exact columns `cols`, the rows' set-aside products) in this
                              thread's buffers, or None: W (times c per input column) rounded per row
    mark_roles(gpt)         the roles of its linears (below), set on them (lamina.quant.saved)
    column_maxima(x) -> max |x| per column; smoothing(x, w_max, x_max=None) -> c per column
    SMOOTH: the smoothing exponent (alpha); OUTLIERS: columns per call done in float;
    ROW_OUTLIERS: entries per row done in float for the "output" role; ROLES

A call lamina.cpu.prefill_int8 picks (a prefill's long calls, where the CPU has VNNI, when
LAMINA_PREFILL_INT8=1 or lamina.cpu.int8_prefill(True); off by default) runs here instead of in
bf16 (quant/bf16.py). The input's rows are rounded to int8 with a scale each, the weights' rows
too (made per call into one reused buffer, as bf16.py's: no kept copy), and the int32 products
scaled back (decode.c "a prefill's linears in int8"). The input is smoothed first (SmoothQuant:
input column i divided by c_i = max|x_i|^SMOOTH / max|W_i|^(1 - SMOOTH), the weights' column
multiplied by it, the product unchanged), which moves the input's outlier channels into the
weights; the weights' column maxima are kept per linear (K floats), made on its first such call.
Then the OUTLIERS input columns largest after smoothing are taken out of both int8 operands
(LLM.int8's split) and multiplied in float32 (x[:, cols] @ W[:, cols].T, those weight columns the
exact floats, taken in the same pass that rounds the rest).

By role (`prefill_role` on the linear, set by mark_roles): "input" (the default; a norm's output,
whose outliers are whole channels) stops there; "output" (the attention's out-projection and the
feed-forward's down-projection, whose inputs are heavy-tailed per row) also takes each row's
ROW_OUTLIERS largest smoothed entries out of the int8 row (its scale from the rest) and adds
their exact products (decode.c, in the weights' pass); "logits" (the head) is not done here.
Against the fp32 model this is nearer than llama.cpp's own prefill (mean KL over 16 x 256 tokens,
BENCHMARKS.md), but further than bf16's, and faster than bf16 only by the margin there: so off.
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


def int8_weights(
    m: Any, c: Tensor | None = None, cols: Tensor | None = None, rows: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None] | None:
    """m's W (times c[i] in input column i, where given) rounded to int8 per output row, in this
    thread's buffers: (q int8 (N, K), scale float32 (N,), W's exact columns `cols` transposed
    (len(cols), N) or None, the set-aside input entries' products (N, M) or None), q * scale[:, None]
    ~ W c; `rows`: (idx, val) of lm_quant_rows_i8's set-aside entries, (topk, M) each, stacked as
    a pair; None where native does not run here or does not read m."""
    parts = _parts(m) if library() is not None else None
    if parts is None:
        return None
    lib, n, k, threads = library(), m.out_features, m.in_features, torch.get_num_threads()
    q = thread_buffer("prefill-i8", (n, k), torch.int8, "cpu")
    scale = thread_buffer("prefill-i8-scale", (1, n), torch.float32, "cpu")[0]
    ncols = 0 if cols is None else len(cols)
    wcols = torch.empty(n, ncols) if ncols else None
    idx, val = (None, None) if rows is None else rows
    topk, m_rows = (0, 0) if idx is None else idx.shape
    corr = torch.empty(n, m_rows) if topk else None
    first = 0
    for kind, w, s, low, rn, gs in parts:
        if not lib.lm_dequant_i8(
            kind, w.data_ptr(), _ptr(s), _ptr(low), rn, k, gs, _ptr(c),
            q[first:].data_ptr(), scale[first:].data_ptr(), _ptr(cols), ncols,
            None if wcols is None else wcols[first:].data_ptr(), m_rows, topk, _ptr(idx),
            _ptr(val), None if corr is None else corr[first:].data_ptr(), threads,
        ):  # fmt: skip
            return None
        first += rn
    return q, scale, None if wcols is None else wcols.t().contiguous(), corr


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
ROW_OUTLIERS = 4  # entries per input row taken out where the role is "output" (below)
ROLES = {"input": 0, "output": ROW_OUTLIERS}  # role -> entries per row; others (the head): bf16


def mark_roles(model: Any) -> None:
    """Set `prefill_role` on a GPT's linears whose role is not "input" (the default: those that
    read a norm's output): each block's attention out-projection and feed-forward down-projection
    read the attention's output and the gate's product, heavy-tailed per row ("output"); the
    head makes the logits and stays in bf16 ("logits")."""
    for block in getattr(model, "blocks", ()):
        for lin in (block.attn.proj, block.ff.proj):
            lin.prefill_role = "output"
    if getattr(model, "head", None) is not None:
        model.head.prefill_role = "logits"


def int8_matmul(m: Any, x: Tensor) -> Tensor | None:
    """x (M, K) float32 @ W.T (M, N) float32 through int8 (see the module), or None where
    int8_weights would be None or m's role (`prefill_role`, default "input") is not in ROLES
    (the caller runs another path)."""
    topk = ROLES.get(getattr(m, "prefill_role", "input"))
    parts = _parts(m) if library() is not None and topk is not None else None
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
        cols = (x_max * cinv).topk(min(OUTLIERS, k // 4)).indices.to(torch.int32)
        cinv[cols] = 0.0
        c[cols] = 0.0
    topk = min(topk, k // 4)
    qx = thread_buffer("prefill-i8-input", (rows, k), torch.int8, "cpu")
    sx = torch.empty(rows)
    sparse = torch.empty(2, topk, rows, dtype=torch.int32) if topk else None
    idx, val = (None, None) if sparse is None else (sparse[0], sparse[1].view(torch.float32))
    if not lib.lm_quant_rows_i8(
        x.data_ptr(), rows, k, cinv.data_ptr(), qx.data_ptr(), sx.data_ptr(), topk,
        _ptr(idx), _ptr(val), threads,
    ):  # fmt: skip
        return None
    w = int8_weights(m, c, cols, None if idx is None else (idx, val))
    if w is None:
        return None
    qw, sw, w_cols, corr = w
    acc = torch._int_mm(qx, qw.t())  # (M, N) int32, a new tensor: scaled in place into floats
    y = acc.view(torch.float32)
    if not lib.lm_i8_scale(
        acc.data_ptr(), sx.data_ptr(), sw.data_ptr(), None, rows, m.out_features, y.data_ptr(),
        _ptr(corr), threads,
    ):  # fmt: skip
        return None
    if w_cols is not None:  # the outlier columns' part of the product, in float32
        y.addmm_(x[:, cols], w_cols)
    return y

"""A training step's causal attention in lamina.native (decode.c lm_train_attention_fwd/_bwd).

    packed_causal_attention(qkv, heads, kv_heads, head_dim, scale) -> (B, T, H hd) or None
    causal_attention(q, k, v, scale) -> (B, T, H hd) or None

Both are autograd functions: the forward keeps each query row's log-sum-exp and the backward
recomputes the weights from it, in C, one head's whole T x T scores at a time (the short
sequences and narrow heads of a small model, where torch's flash kernels are bound by their
per-block overhead; BENCHMARKS.md, "The step, option by option"). The packed form takes the
fused QKV projection's output (B, T, (H + 2 H_kv) hd) as it is and returns its gradient in one
tensor, so no split, transpose, cast or concatenation is recorded around it; the other takes q
(B, H, T, hd) and k, v (B, H_kv, T, hd) views (after rotary positions or norms).

lamina.attention calls them for the training case only: CPU tensors, all bf16 or all float32
(the arithmetic is float32 either way, the results in the inputs' dtype, as SDPA's are), rows of
hd contiguous elements, gradients recorded, a causal mask and nothing else (no padding, no
cache, no window that hides a key, no dropout), T <= 256 and hd a multiple of 8 up to 128.
Everything else returns None and runs SDPA, as does a machine where native does not run or whose
kernel policy is a PyTorch one (`LAMINA_KERNEL=torch`: lamina.cpu.native_step), and a graph that
torch.compile traces. Gradients are SDPA's to float rounding, the same bits at any thread count
(tests/test_native_train_attention.py).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from lamina.cpu import native_step
from lamina.native.build import library

MAX_T = 256  # decode.c TA_TMAX
MAX_HEAD = 128  # decode.c TA_HD


def _shape_ok(B: int, H: int, Hkv: int, T: int, hd: int) -> bool:
    return (
        B >= 1
        and Hkv >= 1
        and H % Hkv == 0
        and 1 <= T <= MAX_T
        and hd % 8 == 0
        and 8 <= hd <= MAX_HEAD
    )


def _dtype_ok(*ts: Tensor) -> bool:
    """All bf16 or all float32 CPU tensors with unit last stride, one recording a gradient, in
    eager mode where native runs."""
    dtype = ts[0].dtype
    return (
        dtype in (torch.float32, torch.bfloat16)
        and all(t.dtype == dtype and t.device.type == "cpu" and t.stride(-1) == 1 for t in ts)
        and torch.is_grad_enabled()
        and any(t.requires_grad for t in ts)
        and not torch.compiler.is_compiling()
        and native_step()
    )


# Each call passes C pointers and (batch, head, position) strides in elements, for q, k, v as
# (B, H, T, hd) and k, v as (B, H_kv, T, hd) arrays of rows, and out or dout as (B, T, H hd).
_Rows = tuple[int, int, int, int]  # pointer, batch, head and position strides


def _rows(t: Tensor) -> _Rows:
    """A (B, n, T, hd) tensor's rows."""
    return (t.data_ptr(), *t.stride()[:3])


def _packed_rows(qkv: Tensor, H: int, Hkv: int, hd: int) -> tuple[_Rows, _Rows, _Rows]:
    """q's, k's and v's rows in the fused projection's output (B, T, (H + 2 H_kv) hd)."""
    p, e, (sb, st, _) = qkv.data_ptr(), qkv.element_size(), qkv.stride()
    return (p, sb, hd, st), (p + H * hd * e, sb, hd, st), (p + (H + Hkv) * hd * e, sb, hd, st)


def _out_rows(out: Tensor, H: int, hd: int) -> _Rows:
    """A (B, T, H hd) tensor's rows, contiguous."""
    T = out.shape[1]
    return (out.data_ptr(), T * H * hd, hd, H * hd)


def _call(
    fn: str,
    ptrs: tuple[int, ...],
    rows: tuple[_Rows, ...],
    dims: tuple[int, ...],
    scale: float,
    bf16: bool,
) -> None:
    """decode.c's `fn` on ptrs (its pointer arguments in order), the rows' strides, dims."""
    strides = (ctypes.c_int64 * (3 * len(rows)))(*(s for r in rows for s in r[1:]))
    lib = library()
    ok = lib is not None and getattr(lib, fn)(
        *ptrs, *dims, float(scale), int(bf16), strides, torch.get_num_threads()
    )
    if not ok:
        raise RuntimeError(f"lamina.native's training attention ({fn}) refused its call")


def _forward(
    q: _Rows, k: _Rows, v: _Rows, dims: tuple[int, ...], dtype: torch.dtype, scale: float
) -> tuple[Tensor, Tensor]:
    """(out (B, T, H hd), lse (B, H, T) float32)."""
    B, H, _, T, hd = dims
    out = torch.empty(B, T, H * hd, dtype=dtype)
    lse = torch.empty(B, H, T, dtype=torch.float32)
    rows = (q, k, v, _out_rows(out, H, hd))
    ptrs = (*(r[0] for r in rows), lse.data_ptr())  # q, k, v, out, lse
    _call("lm_train_attention_fwd", ptrs, rows, dims, scale, dtype == torch.bfloat16)
    return out, lse


def _backward(
    q: _Rows,
    k: _Rows,
    v: _Rows,
    dout: Tensor,
    lse: Tensor,
    grads: tuple[_Rows, ...],
    dims: tuple[int, ...],
    dtype: torch.dtype,
    scale: float,
) -> None:
    """Fill the gradients' rows from dout (B, T, H hd)."""
    dout = dout.contiguous()
    if dout.dtype != dtype:
        dout = dout.to(dtype)
    rows = (q, k, v, _out_rows(dout, dims[1], dims[4]), *grads)
    ptrs = (*(r[0] for r in rows[:4]), lse.data_ptr(), *(r[0] for r in rows[4:]))
    _call("lm_train_attention_bwd", ptrs, rows, dims, scale, dtype == torch.bfloat16)


class _Packed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv: Tensor, H: int, Hkv: int, hd: int, scale: float) -> Tensor:  # type: ignore[override]
        dims = (qkv.shape[0], H, Hkv, qkv.shape[1], hd)
        out, lse = _forward(*_packed_rows(qkv, H, Hkv, hd), dims, qkv.dtype, scale)
        ctx.save_for_backward(qkv, lse)
        ctx.meta = (dims, scale)
        return out

    @staticmethod
    def backward(ctx, dout: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        qkv, lse = ctx.saved_tensors
        dims, scale = ctx.meta
        _, H, Hkv, _, hd = dims
        dqkv = torch.empty(qkv.shape, dtype=qkv.dtype)
        grads = _packed_rows(dqkv, H, Hkv, hd)
        _backward(*_packed_rows(qkv, H, Hkv, hd), dout, lse, grads, dims, qkv.dtype, scale)
        return dqkv, None, None, None, None


class _Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        B, H, T, hd = q.shape
        dims = (B, H, k.shape[1], T, hd)
        out, lse = _forward(_rows(q), _rows(k), _rows(v), dims, q.dtype, scale)
        ctx.save_for_backward(q, k, v, lse)
        ctx.meta = (dims, scale)
        return out

    @staticmethod
    def backward(ctx, dout: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, lse = ctx.saved_tensors
        dims, scale = ctx.meta
        B, H, Hkv, T, hd = dims
        grads = tuple(
            torch.empty(B, T, n, hd, dtype=q.dtype).transpose(1, 2) for n in (H, Hkv, Hkv)
        )
        rows = tuple(_rows(t) for t in (q, k, v))
        _backward(*rows, dout, lse, tuple(_rows(g) for g in grads), dims, q.dtype, scale)
        return *grads, None


def packed_causal_attention(
    qkv: Tensor, heads: int, kv_heads: int, head_dim: int, scale: float
) -> Tensor | None:
    """softmax(scale q k^T, causal) v for the fused projection's rows qkv (B, T, (H + 2 H_kv) hd),
    as (B, T, H hd), recording one autograd node; None where the kernel does not run (see the
    module docstring), so that the caller runs SDPA."""
    B, T, width = qkv.shape
    if width != (heads + 2 * kv_heads) * head_dim or not _shape_ok(B, heads, kv_heads, T, head_dim):
        return None
    if not _dtype_ok(qkv) or library() is None:
        return None
    return _Packed.apply(qkv, heads, kv_heads, head_dim, float(scale))


def causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor | None:
    """softmax(scale q k^T, causal) v for q (B, H, T, hd) and k, v (B, H_kv, T, hd), as
    (B, T, H hd); None where the kernel does not run, so that the caller runs SDPA."""
    B, H, T, hd = q.shape
    Hkv = k.shape[1]
    if tuple(k.shape) != (B, Hkv, T, hd) or tuple(v.shape) != (B, Hkv, T, hd):
        return None
    if not _shape_ok(B, H, Hkv, T, hd) or not _dtype_ok(q, k, v) or library() is None:
        return None
    return _Split.apply(q, k, v, float(scale))

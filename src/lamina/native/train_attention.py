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

import torch
from torch import Tensor

from lamina.cpu import native_step
from lamina.native.build import library

MAX_T = 256  # decode.c TA_TMAX
MAX_HEAD = 128  # decode.c TA_HD


def _takes(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether the kernel may run on these (B, H, T, hd) views (the rest decode.c checks again)."""
    dtype = q.dtype
    if dtype not in (torch.float32, torch.bfloat16):
        return False
    if any(t.dtype != dtype or t.device.type != "cpu" or t.stride(-1) != 1 for t in (q, k, v)):
        return False
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))):
        return False
    if torch.compiler.is_compiling() or not native_step():
        return False
    B, H, T, hd = q.shape
    Hkv = k.shape[1]
    return (
        tuple(k.shape) == tuple(v.shape) == (B, Hkv, T, hd)
        and H % Hkv == 0
        and 1 <= T <= MAX_T
        and hd % 8 == 0
        and 8 <= hd <= MAX_HEAD
    )


def _strides(*ts: Tensor) -> Tensor:
    return torch.tensor([s for t in ts for s in t.stride()[:3]], dtype=torch.int64)


def _forward(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """(out (B, T, H hd), lse (B, H, T) float32) for (B, H, T, hd) views q and (B, H_kv, T, hd)
    views k, v."""
    B, H, T, hd = q.shape
    out = torch.empty(B, T, H * hd, dtype=q.dtype)
    lse = torch.empty(B, H, T, dtype=torch.float32)
    o = out.view(B, T, H, hd).transpose(1, 2)
    strides = _strides(q, k, v, o)  # held: the call reads it
    lib = library()
    ok = lib is not None and lib.lm_train_attention_fwd(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
        B, H, k.shape[1], T, hd, float(scale), int(q.dtype == torch.bfloat16),
        strides.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if not ok:
        raise RuntimeError("lamina.native's training attention refused a shape it was given")
    return out, lse


def _backward(
    q: Tensor, k: Tensor, v: Tensor, dout: Tensor, lse: Tensor, grads: tuple[Tensor, ...], scale: float
) -> None:
    """Fill grads (dq, dk, dv: views shaped as q, k, v) from dout (B, T, H hd)."""
    B, H, T, hd = q.shape
    do = dout.contiguous().view(B, T, H, hd).transpose(1, 2)
    dq, dk, dv = grads
    strides = _strides(q, k, v, do, dq, dk, dv)
    lib = library()
    ok = lib is not None and lib.lm_train_attention_bwd(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), do.data_ptr(), lse.data_ptr(),
        dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
        B, H, k.shape[1], T, hd, float(scale), int(q.dtype == torch.bfloat16),
        strides.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if not ok:
        raise RuntimeError("lamina.native's training attention backward failed")


def _split(qkv: Tensor, H: int, Hkv: int, hd: int) -> tuple[Tensor, Tensor, Tensor]:
    """q (B, H, T, hd), k, v (B, H_kv, T, hd): views of the packed rows (B, T, (H + 2 H_kv) hd)."""
    B, T, _ = qkv.shape
    q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
    return (
        q.view(B, T, H, hd).transpose(1, 2),
        k.view(B, T, Hkv, hd).transpose(1, 2),
        v.view(B, T, Hkv, hd).transpose(1, 2),
    )


class _Packed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv: Tensor, H: int, Hkv: int, hd: int, scale: float) -> Tensor:  # type: ignore[override]
        out, lse = _forward(*_split(qkv, H, Hkv, hd), scale)
        ctx.save_for_backward(qkv, lse)
        ctx.meta = (H, Hkv, hd, scale)
        return out

    @staticmethod
    def backward(ctx, dout: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        qkv, lse = ctx.saved_tensors
        H, Hkv, hd, scale = ctx.meta
        dqkv = torch.empty(qkv.shape, dtype=qkv.dtype)
        _backward(*_split(qkv, H, Hkv, hd), dout, lse, _split(dqkv, H, Hkv, hd), scale)
        return dqkv, None, None, None, None


class _Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        out, lse = _forward(q, k, v, scale)
        ctx.save_for_backward(q, k, v, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, lse = ctx.saved_tensors
        B, H, T, hd = q.shape
        Hkv = k.shape[1]
        grads = tuple(
            torch.empty(B, T, n, hd, dtype=q.dtype).transpose(1, 2) for n in (H, Hkv, Hkv)
        )
        _backward(q, k, v, dout, lse, grads, ctx.scale)
        return *grads, None


def packed_causal_attention(
    qkv: Tensor, heads: int, kv_heads: int, head_dim: int, scale: float
) -> Tensor | None:
    """softmax(scale q k^T, causal) v for the fused projection's rows qkv (B, T, (H + 2 H_kv) hd),
    as (B, T, H hd), recording one autograd node; None where the kernel does not run (see the
    module docstring), so that the caller runs SDPA."""
    if qkv.dim() != 3 or qkv.shape[-1] != (heads + 2 * kv_heads) * head_dim:
        return None
    if not _takes(*_split(qkv, heads, kv_heads, head_dim)) or library() is None:
        return None
    return _Packed.apply(qkv, heads, kv_heads, head_dim, float(scale))


def causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor | None:
    """softmax(scale q k^T, causal) v for q (B, H, T, hd) and k, v (B, H_kv, T, hd), as
    (B, T, H hd); None where the kernel does not run, so that the caller runs SDPA."""
    if not _takes(q, k, v) or library() is None:
        return None
    return _Split.apply(q, k, v, float(scale))

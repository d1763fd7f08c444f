"""A frozen quantized linear that still passes gradients to its input (LoRA over a quantized
base: QLoRA).

    frozen_linear(x, base) -> x @ W.T + bias for any `base` with `dequantized(dtype)` (int8,
        int4, a GGUF file's kept blocks), differentiable in x: W is dequantized in the forward
        and again in the backward, so autograd never keeps a float copy of it in between (which
        F.linear on the dequantized W would: one per layer, the whole model in float by the end
        of a forward); under autocast W is dequantized straight to the autocast dtype
    times_wt(x, base, rows, dtype) -> x @ W.T, times_w(g, base, rows, dtype) -> g @ W: the two
        products through the quantized W (no autograd), a piece of rows at a time given `rows`
    pieces(base, rows, dtype) -> (first row, W's rows dequantized): all of W, or CHUNK rows at
        a time given `rows` (what chunked_ce.frozen_head_loss reads a quantized head by)
    FrozenLinear(base, rows=None)  a module doing that while gradients are on (or always,
        given `rows`), the base's own kernels (which have no backward) otherwise
A caller that can read W by rows (`rows(start, stop, dtype, out=None)`) gets a wide layer
dequantized CHUNK rows at a time, forward and backward: the float copy of a 49k-row head is
never whole (`out`: an fp32 tensor of the rows' shape to write them into, or None).

    keeping() -> bool  whether this thread is inside one
    kept_dequantization()  a context: inside, W (or a piece) of a base that dequantizes into a
        buffer (int8, int4) goes into buffers this thread keeps, not fresh tensors (see there)
    thread_buffer(role, shape, dtype, device) -> a view of this thread's buffer for the role
    dequantized(base, dtype, rows=None, start=0, stop=None) -> W[start:stop] so (what
        `pieces` and lamina.quant's dequantized matmul read W by)

Deliberately unaware of adapters, of how weights are quantized and of training.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

Rows = Callable[..., Tensor]  # (start, stop, dtype, out=None) -> W[start:stop], into `out`
CHUNK = 4096  # output rows dequantized at a time where the weights can be read by rows
_KEPT = threading.local()  # this thread's dequantization buffers, inside kept_dequantization


def keeping() -> bool:
    """Whether this thread is inside kept_dequantization (`lamina train`)."""
    return getattr(_KEPT, "depth", 0) > 0


@contextlib.contextmanager
def kept_dequantization() -> Iterator[None]:
    """Inside, on this thread: int8/int4 weights dequantized for a matmul (`pieces`, and the
    layers' own dequantized path, lamina.quant.dequantized_matmul) go into buffers kept for the
    purpose (one fp32, one of the compute dtype, each the size of the largest W or piece read:
    ~9 MiB fp32 for SmolLM2's 4096-row head pieces) instead of fresh tensors: the same numbers,
    and a step's hundreds of same-sized float temporaries (forward, recomputation and backward
    of every layer; an evaluation's) stay out of the C heap, where the free chunks left between
    them stayed resident (BENCHMARKS.md, "QLoRA's memory, the heap"). The buffers are freed on
    leaving the outermost one. `lamina train` runs inside one."""
    depth = getattr(_KEPT, "depth", 0)
    _KEPT.depth = depth + 1
    try:
        yield
    finally:
        _KEPT.depth = depth
        if depth == 0:
            _KEPT.buffers = {}


def thread_buffer(role: str, shape: tuple[int, int], dtype: torch.dtype, device: Any) -> Tensor:
    """A tensor of `shape` over this thread's buffer for (role, dtype, device), grown to the
    largest asked for (its old contents are not kept; a view the next call may overwrite).
    Outside kept_dequantization a buffer stays until the thread leaves one (a prefill's bf16
    weights, lamina.quant.bf16)."""
    kept = _KEPT.__dict__.setdefault("buffers", {})
    key, n = (role, dtype, torch.device(device)), shape[0] * shape[1]
    flat = kept.get(key)
    if flat is None or flat.numel() < n:
        kept[key] = flat = None  # the old one freed before the larger one is made
        kept[key] = flat = torch.empty(n, dtype=dtype, device=device)
    return flat[:n].view(shape)


def dequantized(base: nn.Module, dtype: torch.dtype, rows: Rows | None = None,
                start: int = 0, stop: int | None = None) -> Tensor:  # fmt: skip
    """W[start:stop] (all of W without `rows`) in `dtype`, into the kept buffers inside
    kept_dequantization where the base dequantizes into one (`dequantizes_into`: int8, int4;
    the same numbers either way; a view the next call may overwrite), else a fresh tensor."""
    stop = base.out_features if stop is None else stop
    into = getattr(base, "dequantizes_into", False) and getattr(_KEPT, "depth", 0) > 0
    if not into:
        return base.dequantized(dtype) if rows is None else rows(start, stop, dtype)
    fp32_first = dtype == torch.float32 or getattr(base, "dequantizes_in_fp32", False)
    if rows is None and not fp32_first:  # all of W made in `dtype` itself (int8): no buffer
        return base.dequantized(dtype)
    device = (base.qweight if hasattr(base, "qweight") else base.weight).device
    out = thread_buffer("fp32", (stop - start, base.in_features), torch.float32, device)
    # made in fp32, then cast: as without `out`
    w = (
        base.dequantized(torch.float32, out=out)
        if rows is None
        else rows(start, stop, out.dtype, out)
    )
    if dtype == torch.float32:
        return w
    return thread_buffer("cast", tuple(w.shape), dtype, device).copy_(w)


def pieces(base: nn.Module, rows: Rows | None, dtype: torch.dtype) -> Iterator[tuple[int, Tensor]]:
    """(first row, dequantized rows) covering W: all at once, or CHUNK rows at a time. A piece
    may be a view of a buffer the next one overwrites: use each before taking the next."""
    n = base.out_features
    if rows is None:
        yield 0, dequantized(base, dtype)
        return
    for start in range(0, n, CHUNK):
        yield start, dequantized(base, dtype, rows, start, min(n, start + CHUNK))


def times_wt(x: Tensor, base: nn.Module, rows: Rows | None, dtype: torch.dtype) -> Tensor:
    """x @ W.T (no bias, no autograd), W dequantized to `dtype` a piece at a time (`rows`)."""
    out = x.new_empty(*x.shape[:-1], base.out_features, dtype=dtype)
    x = x.to(dtype)
    for start, w in pieces(base, rows, dtype):
        out[..., start : start + w.shape[0]] = x @ w.T
    return out


def times_w(g: Tensor, base: nn.Module, rows: Rows | None, dtype: torch.dtype) -> Tensor:
    """g @ W (the input's gradient of x @ W.T), W dequantized to `dtype` a piece at a time."""
    total, g = None, g.to(dtype)
    for start, w in pieces(base, rows, dtype):
        part = g[..., start : start + w.shape[0]] @ w
        total = part if total is None else total.add_(part)
    return total


class _DequantizedMatmul(torch.autograd.Function):
    """x @ W.T for a frozen quantized W, dequantized in the forward and again in the backward:
    autograd keeps no float copy of W in between (F.linear on the dequantized W would keep one
    per layer until the backward, the whole model in float by the end of the forward)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, base: nn.Module, rows: Rows | None) -> Tensor:
        ctx.base, ctx.rows = base, rows
        return times_wt(x, base, rows, x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return times_w(grad, ctx.base, ctx.rows, grad.dtype), None, None


def frozen_linear(x: Tensor, base: nn.Module, rows: Rows | None = None) -> Tensor:
    """A quantized base's output with a gradient for `x` (the int8/int4 kernels have none);
    under autocast the weights are dequantized straight to the autocast dtype. `rows`: reads
    W's rows start:stop, so that a wide layer (a head) is dequantized CHUNK rows at a time."""
    kind = x.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
    with torch.autocast(kind, enabled=False):
        y = _DequantizedMatmul.apply(x.to(dtype), base, rows)
    return y if base.bias is None else y + base.bias.to(y.dtype)


class FrozenLinear(nn.Module):
    """A quantized linear without adapters on the gradient's way (the head, an untargeted
    projection): `frozen_linear` while gradients are on, or always when its rows can be read
    a chunk at a time (`rows`: a head's float copy is never made whole); the base's own
    kernels otherwise."""

    def __init__(self, base: nn.Module, rows: Rows | None = None) -> None:
        super().__init__()
        self.base, self.rows = base, rows
        self.in_features, self.out_features = base.in_features, base.out_features

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() or self.rows is not None:
            return frozen_linear(x, self.base, self.rows)
        return self.base(x)

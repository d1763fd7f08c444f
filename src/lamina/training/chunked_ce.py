"""Cross-entropy through the LM head in chunks of rows, never holding the full (N, V) logits.

    chunked_cross_entropy(hidden, weight, targets, chunk=1024) -> mean loss (fp32 scalar)
        hidden (N, d), weight (V, d) (the head's), targets (N,): the same value and gradients as
        F.cross_entropy(hidden @ weight.T, targets), with at most `chunk` rows of logits alive
        at a time, in the forward and in the backward (which recomputes each chunk's logits)
    lm_loss_chunked(model, ids, targets, chunk=1024) -> the same loss from a lamina GPT
    frozen_head_loss(model, ids, targets) -> the same loss for a GPT whose head gets no
        gradient (LoRA): HEAD_CHUNK rows at a time against frozen_linear.CHUNK rows of W at a
        time (a running logsumexp, then a second pass for the gradient, made in the forward),
        so no more than HEAD_CHUNK x CHUNK logits are alive. The head is a frozen float nn.Linear
        or a quantized FrozenLinear (QLoRA; its W read a piece of rows at a time,
        frozen_linear.pieces, so no float copy of it is whole either);
        None where the model does not qualify (a trainable, biased or soft-capped head): then
        use the full logits. Targets of IGNORE (-100) are skipped; `rows_mean=True` gives
        SFT's loss (each row's mean over its targets, averaged over rows)
    frozen_head_nll(model, ids, targets) -> each position's nll through the same chunks, under
        no_grad (an evaluation without the full logits)

For a big vocabulary (50k tokens x 16k positions is 3.3 GB of fp32 logits, and as much again
for their gradient) this bounds the loss's memory at chunk x V. It costs one extra head matmul
in the backward. At a character vocabulary it buys nothing (bench/step.py measures it); it is
a building block, not a default.

Deliberately unaware of optimizers and the training loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from lamina.data.instruct import IGNORE
from lamina.errors import LaminaError
from lamina.frozen_linear import FrozenLinear, pieces


class _ChunkedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int) -> Tensor:
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32 at least, as lm_loss
        total = torch.zeros((), dtype=acc, device=hidden.device)
        lse = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            logits = (hidden[s : s + chunk] @ weight.T).to(acc)
            lse[s : s + chunk] = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, targets[s : s + chunk, None]).squeeze(1)
            total += (lse[s : s + chunk] - picked).sum()
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk = chunk
        return total / hidden.shape[0]

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        hidden, weight, targets, lse = ctx.saved_tensors
        n, chunk = hidden.shape[0], ctx.chunk
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight, dtype=lse.dtype) if ctx.needs_input_grad[1] else None
        scale = grad_out.to(lse.dtype) / n
        for s in range(0, n, chunk):
            h = hidden[s : s + chunk]
            logits = (h @ weight.T).to(lse.dtype)
            g = torch.exp(logits - lse[s : s + chunk, None])  # softmax
            g[torch.arange(h.shape[0], device=h.device), targets[s : s + chunk]] -= 1.0
            g = (g * scale).to(hidden.dtype)
            if grad_h is not None:
                grad_h[s : s + chunk] = g @ weight.to(hidden.dtype)
            if grad_w is not None:
                grad_w += (g.T @ h).to(lse.dtype)
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None


HEAD_CHUNK = 1024  # rows of hidden states per pass over the head's pieces (frozen_linear.CHUNK
# rows of W each): 1024 x 4096 fp32 logits alive, 16 MiB


Pieces = Callable[[], Iterator[tuple[int, Tensor]]]  # -> (first row, W's rows in the dtype)


def _piece_logits(h: Tensor, w: Tensor) -> Tensor:
    return (h @ w.T).float()  # in the compute dtype, then fp32: as the full path


def _targets_in(t: Tensor, first: int, width: int) -> tuple[Tensor, Tensor]:
    """(rows whose target is one of W's rows first..first + width, that target's column)."""
    rows = ((t >= first) & (t < first + width)).nonzero().squeeze(1)
    return rows, t[rows] - first


def _head_nll(
    hidden: Tensor, read_w: Pieces, targets: Tensor, weights: Tensor | None, dtype: Any
) -> tuple[Tensor, Tensor | None]:
    """(each row's nll (N,) fp32, 0 at IGNORE targets; given `weights` (N,), the gradient of
    sum(weights * nll) for the hidden states, else None). HEAD_CHUNK rows at a time, each over
    W's pieces: a first pass makes the logsumexp (running) and picks the targets' logits, a
    second (only for the gradient) makes each piece's logits again, their softmax minus the
    one-hot, and its product with the piece. Only one piece's logits are alive at a time.
    Rows whose target is IGNORE are skipped (no logits made for them)."""
    n = hidden.shape[0]
    nll = torch.zeros(n, dtype=torch.float32, device=hidden.device)
    grad = torch.zeros_like(hidden) if weights is not None else None
    keep = (targets != IGNORE).nonzero().squeeze(1)
    for s in range(0, len(keep), HEAD_CHUNK):
        at = keep[s : s + HEAD_CHUNK]
        t, h = targets[at], hidden[at].to(dtype)
        top = torch.full((len(t),), -torch.inf, device=h.device)
        total, picked = torch.zeros_like(top), torch.zeros_like(top)
        for first, w in read_w():
            logits = _piece_logits(h, w)
            new_top = torch.maximum(top, logits.amax(-1))
            total = total * (top - new_top).exp() + (logits - new_top[:, None]).exp().sum(-1)
            top = new_top
            rows, cols = _targets_in(t, first, w.shape[0])
            picked[rows] = logits[rows, cols]
        lse = top + total.log()
        nll[at] = lse - picked
        if grad is None:
            continue
        g_h = None
        for first, w in read_w():
            g = _piece_logits(h, w).sub_(lse[:, None]).exp_()  # softmax, in place of the logits
            g[_targets_in(t, first, w.shape[0])] -= 1.0
            part = g.mul_(weights[at, None]).to(dtype) @ w
            g_h = part if g_h is None else g_h.add_(part)
        grad[at] = g_h.to(hidden.dtype)
    return nll, grad


class _FrozenHeadCE(torch.autograd.Function):
    """sum(weights * nll) of (hidden @ W.T) against targets and, where hidden needs one, its
    gradient, both in the forward (W gets none): the backward only scales the kept gradient.
    `pieces()` gives W a piece of rows at a time (a float weight sliced, or a quantized one
    dequantized piece by piece), in `dtype`. The logits are as the full path makes them (in
    the autocast dtype, then fp32), and so is their gradient."""

    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, pieces: Pieces, targets: Tensor, weights: Tensor, dtype: Any
    ) -> Tensor:
        w = weights if hidden.requires_grad else None
        nll, ctx.grad = _head_nll(hidden, pieces, targets, w, dtype)
        return (nll * weights).sum()

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        grad, ctx.grad = ctx.grad, None
        scaled = None if grad is None else grad * grad_out.to(grad.dtype)
        return scaled, None, None, None, None


def _hidden(model: nn.Module, ids: Tensor) -> Tensor:
    """The final-norm hidden states (N, d) of a lamina GPT: the head's input."""
    x, rope = model.embed_with_rope(ids)
    for block in model.blocks:
        x, _ = block(x, None, False, None, rope)
    hidden = model.norm_f(x)
    return hidden.reshape(-1, hidden.shape[-1])


def _frozen(head: Any) -> bool:
    """Whether `head` is one frozen_head_loss takes: a frozen float nn.Linear without a bias,
    or a FrozenLinear (a quantized base, which never trains) without one."""
    if type(head) is nn.Linear:
        return not head.weight.requires_grad and head.bias is None
    return type(head) is FrozenLinear and head.base.bias is None


def _pieces(head: nn.Module, dtype: torch.dtype) -> Pieces:
    """A `_frozen` head's W in `dtype`, frozen_linear.CHUNK rows at a time (frozen_linear.pieces
    for every kind): a quantized base read by rows where it can be (no float copy of it
    whole), else a float weight (cast once if the dtype differs) or the base dequantized once
    (as the full path), sliced."""
    if type(head) is FrozenLinear and head.rows is not None:
        base, rows = head.base, head.rows
    else:
        base = head if type(head) is nn.Linear else head.base
        w = head.weight.to(dtype) if type(head) is nn.Linear else base.dequantized(dtype)

        def rows(start: int, stop: int, _dtype: torch.dtype) -> Tensor:
            return w[start:stop]

    return lambda: pieces(base, rows, dtype)


def _weights(targets: Tensor, rows_mean: bool) -> Tensor:
    """Each position's weight in the loss (0 at IGNORE): the mean over every counted target,
    or (`rows_mean`) each row's mean over its own, averaged over the rows."""
    counted = (targets != IGNORE).float()
    if rows_mean:
        per_row = counted / counted.sum(-1, keepdim=True).clamp(min=1) / targets.shape[0]
        return per_row.reshape(-1)
    return counted.reshape(-1) / counted.sum().clamp(min=1)


def _through_head(model: nn.Module, ids: Tensor) -> tuple[Tensor, Pieces, Any] | None:
    """(hidden (N, d), W's pieces, the compute dtype), or None where the model's head is not
    one frozen_head_loss takes."""
    head = getattr(model, "head", None)
    if not _frozen(head) or getattr(model.config, "logit_softcap", None) is not None:
        return None
    kind = ids.device.type
    on = torch.is_autocast_enabled(kind)
    hidden = _hidden(model, ids)
    dtype = torch.get_autocast_dtype(kind) if on else hidden.dtype
    return hidden, _pieces(head, dtype), dtype


def frozen_head_loss(
    model: nn.Module, ids: Tensor, targets: Tensor, rows_mean: bool = False
) -> Tensor | None:
    """A GPT's next-token loss through a frozen head (float, or quantized), gradients made in
    the forward (see the module docstring): the mean over the targets that are not IGNORE, or
    (`rows_mean`) each row's mean, averaged over rows (SFT's); None where the head is not one
    this takes."""
    got = _through_head(model, ids)
    if got is None:
        return None
    hidden, pieces_, dtype = got
    weights = _weights(targets, rows_mean).to(hidden.device)
    with torch.autocast(ids.device.type, enabled=False):
        return _FrozenHeadCE.apply(hidden, pieces_, targets.reshape(-1), weights, dtype)


@torch.no_grad()
def frozen_head_nll(model: nn.Module, ids: Tensor, targets: Tensor) -> Tensor | None:
    """Each position's next-token nll (targets' shape, fp32; 0 at IGNORE targets) through the
    same chunked head, no gradient (an evaluation); None where frozen_head_loss would be."""
    got = _through_head(model, ids)
    if got is None:
        return None
    hidden, pieces_, dtype = got
    with torch.autocast(ids.device.type, enabled=False):
        nll, _ = _head_nll(hidden, pieces_, targets.reshape(-1), None, dtype)
    return nll.view(targets.shape)


def chunked_cross_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int = 1024
) -> Tensor:
    """Mean cross-entropy of (hidden @ weight.T) against targets, `chunk` rows at a time."""
    if chunk < 1:
        raise LaminaError(f"chunk must be at least 1, got {chunk}")
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise LaminaError(
            f"hidden must be (N, d) and targets (N,), got {tuple(hidden.shape)} and "
            f"{tuple(targets.shape)}"
        )
    return _ChunkedCE.apply(hidden, weight, targets, chunk)


def lm_loss_chunked(model: nn.Module, ids: Tensor, targets: Tensor, chunk: int = 1024) -> Tensor:
    """A lamina GPT's mean next-token loss on (ids, targets) with the head chunked."""
    if model.config.logit_softcap is not None:
        raise LaminaError("the chunked loss does not take logit_softcap; use the full logits")
    return chunked_cross_entropy(_hidden(model, ids), model.head.weight, targets.reshape(-1), chunk)

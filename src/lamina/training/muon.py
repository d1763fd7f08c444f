"""Muon for the blocks' 2-D weight matrices and AdamW for the rest, as one optimizer.

    MuonAdamW(groups, lr, betas, momentum, ns_steps, ns_dtype)
        groups: param groups, each with "kind": "muon" (2-D matrices) or "adamw" (embeddings,
        head, gains and biases), and optionally "lr_scale" (the loop sets lr * lr_scale).
    orthogonalize(G, steps, dtype) -> the nearest semi-orthogonal matrix to G, approximately
        (a quintic Newton-Schulz iteration, Keller Jordan's coefficients 3.4445, -4.7750, 2.0315).

Muon step for a matrix W (out x in) with gradient G: a momentum buffer M = mu M + G, the
Nesterov update U = G + mu M, then W <- W (1 - lr wd) - lr * 0.2 sqrt(max(out, in)) * NS(U).
The 0.2 sqrt(max(out, in)) factor (Moonshot's "match the RMS of AdamW") gives the update the
root mean square of a typical AdamW step, so one learning-rate table serves both kinds.

The Newton-Schulz iterations run in fp32 by default: `torch.optim.Muon` runs them in bf16, which
is fast where the hardware has bf16 matmuls (GPUs, AMX) and slow where bf16 is emulated (AVX2
CPUs); ``ns_dtype`` chooses. The state (momentum buffers, AdamW moments, step counts) lives in
the standard ``state_dict``, so the checkpoint code that saves AdamW saves this too.

Deliberately unaware of models (it sees parameter groups), data and files.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim.adam import adam

from lamina.cpu import fused_adamw
from lamina.errors import LaminaError

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(g: Tensor, steps: int = 5, dtype: torch.dtype = torch.float32) -> Tensor:
    """Approximately U V^T of G = U S V^T, by a quintic Newton-Schulz iteration; G may be a
    stack (n, rows, cols) of matrices, each orthogonalized alone (batched matmuls)."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    x = x / (torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True) + 1e-7)
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    for _ in range(steps):
        s = x @ x.mT
        x = a * x + (b * s + c * s @ s) @ x
    return (x.mT if tall else x).to(g.dtype)


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer: Muon on groups with kind "muon", AdamW on groups with kind "adamw"."""

    def __init__(
        self,
        groups: Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        ns_steps: int = 5,
        eps: float = 1e-8,
        ns_dtype: torch.dtype = torch.float32,
    ):
        groups = list(groups)
        for g in groups:
            if g.get("kind") not in ("muon", "adamw"):
                raise LaminaError(f"each group needs kind 'muon' or 'adamw', got {g.get('kind')!r}")
            if g["kind"] == "muon":
                bad = [tuple(p.shape) for p in g["params"] if p.dim() != 2]
                if bad:
                    raise LaminaError(f"Muon takes 2-D matrices only, got shapes {bad[:3]}")
        if not any(g["kind"] == "muon" and g["params"] for g in groups):
            raise LaminaError("Muon needs at least one 2-D weight matrix; this model has none")
        defaults = dict(
            lr=lr, betas=betas, weight_decay=weight_decay, momentum=momentum,
            ns_steps=ns_steps, eps=eps, lr_scale=1.0,
        )  # fmt: skip
        super().__init__(groups, defaults)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["kind"] == "muon":
                self._muon(group)
            else:
                self._adamw(group)
        return loss

    def _muon(self, group: dict[str, Any]) -> None:
        """The group's matrices of one shape step together: momentum with foreach ops, one
        batched Newton-Schulz per shape (per-matrix calls were most of a small model's step)."""
        lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
        by_shape: dict[tuple[int, ...], list[Tensor]] = {}
        for p in group["params"]:
            if p.grad is not None:
                by_shape.setdefault(tuple(p.shape), []).append(p)
        for shape, params in by_shape.items():
            grads = [p.grad for p in params]
            bufs = []
            for p in params:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                bufs.append(state["momentum_buffer"])
            torch._foreach_mul_(bufs, mu)
            torch._foreach_add_(bufs, grads)
            updates = torch._foreach_add(grads, bufs, alpha=mu)
            o = orthogonalize(torch.stack(updates), group["ns_steps"], self.ns_dtype)
            if wd:
                torch._foreach_mul_(params, 1 - lr * wd)
            torch._foreach_add_(params, list(o.unbind(0)), alpha=-lr * 0.2 * math.sqrt(max(shape)))

    def _adamw(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        grads, exp_avgs, exp_avg_sqs, steps = [], [], [], []
        for p in params:
            state = self.state[p]
            if "step" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        beta1, beta2 = group["betas"]
        adam(
            params, grads, exp_avgs, exp_avg_sqs, [], steps,
            fused=fused_adamw(params[0].device.type) or None, decoupled_weight_decay=True,
            lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
            eps=group["eps"], amsgrad=False, maximize=False,
        )  # fmt: skip

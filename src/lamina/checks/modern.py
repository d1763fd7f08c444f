"""Probes of the modern layers (Llama's): RMSNorm, rotary positions, grouped-query attention,
SwiGLU's size, and the block checks over every combination of options.

Like ``probes.py``, each ``check_*`` takes a module or function with the documented interface
and raises ``CheckFailed`` saying what is wrong and by how much:

    norm(x) -> y                       RMSNorm, x, y: (B, T, d)
    rotate(x, positions) -> x'         x (B, H, T, hd), positions (T,) integer
    attn(x) -> out or (out, weights)   causal self-attention with a fused `qkv` Linear whose rows
                                       are [q (H hd) | k (H_kv hd) | v (H_kv hd)] and an output
                                       Linear `proj`; no rotation, no qk-norm
    ff(x) -> y                         a SwiGLU feed-forward, (B, T, d) -> (B, T, d)
    make_block(**options) -> block     for the combinations sweep

Checks run in eval mode with gradients off and restore the module's mode afterwards. They know
the interfaces, not lamina's classes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from lamina.checks.base import expect_shape, first, probing
from lamina.checks.probes import check_block_causality, check_residual_identity
from lamina.errors import CheckFailed
from lamina.models.params import count_module_params


def check_rms_norm(norm: nn.Module, d_model: int = 8, eps: float = 1e-5) -> None:
    """Root mean square 1 over the last dim, without centring: x / sqrt(mean(x^2) + eps)."""
    with probing(norm):
        x = torch.randn(4, 5, d_model) * 3 + 7  # a large mean: centring would show
        y = first(norm(x))
        expect_shape("RMSNorm output", y, x.shape)
        rms = y.pow(2).mean(-1).sqrt()
        worst = (rms - 1).abs().max().item()
        if worst > 1e-3:
            raise CheckFailed(
                f"each vector should have root mean square 1 after RMSNorm: it is off by up to "
                f"{worst:.4f} (mean rms {rms.mean().item():.4f}; is it divided by sqrt(mean(x^2)),"
                " not by the standard deviation?)"
            )
        centred = y.mean(-1).abs().min().item()
        if centred < 1e-3:
            raise CheckFailed(
                "the outputs have mean 0: this RMSNorm subtracts the mean (that is LayerNorm); "
                "RMSNorm only rescales"
            )
        for scale in (1.0, 0.003):  # a tiny scale makes eps matter
            xs = x * scale
            want = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps)
            diff = (first(norm(xs)) - want).abs().max().item()
            if diff > 1e-4:
                raise CheckFailed(
                    f"RMSNorm differs from x / sqrt(mean(x^2) + {eps:g}) by {diff:.3g} at input "
                    f"scale {scale} (where is eps added?)"
                )


def check_rope(
    rotate: Callable[[Tensor, Tensor], Tensor], head_dim: int = 16, tol: float = 1e-5
) -> None:
    """The score of a query at i and a key at j depends only on i - j, and norms are kept."""
    with probing(rotate):
        T, shift = 12, 7
        q, k = torch.randn(1, 2, T, head_dim), torch.randn(1, 2, T, head_dim)
        pos = torch.arange(T)
        rq, rk = rotate(q, pos), rotate(k, pos)
        expect_shape("rotated queries", rq, q.shape)
        scores = rq @ rk.transpose(-2, -1)  # (1, 2, T, T): query i, key j
        moved = rotate(q, pos + shift) @ rotate(k, pos + shift).transpose(-2, -1)
        diff = (moved - scores).abs().max().item()
        if diff > tol:
            raise CheckFailed(
                f"shifting both positions by {shift} changed a query-key score by {diff:.3g}: "
                "a rotary score must depend only on i - j (are q and k rotated by the same "
                "angles, one per pair of dimensions?)"
            )
        plain = q @ k.transpose(-2, -1)
        if (scores - plain).abs().max().item() < 1e-4:
            raise CheckFailed("the rotation does nothing: scores equal the unrotated q k^T")
        change = ((rq.norm(dim=-1) - q.norm(dim=-1)).abs() / q.norm(dim=-1)).max().item()
        if change > 1e-5:
            raise CheckFailed(
                f"a rotation must keep each vector's norm; it changed one by {change:.2%} "
                "(cos and sin of one angle per pair?)"
            )


def _written_out_gqa(attn: nn.Module, x: Tensor, n_heads: int, n_kv_heads: int) -> Tensor:
    """Causal multi-head attention from `attn`'s fused weights, each k/v head repeated."""
    B, T, d = x.shape
    hd = d // n_heads
    qkv = x @ attn.qkv.weight.T + (0 if attn.qkv.bias is None else attn.qkv.bias)
    q, k, v = qkv.split([n_heads * hd, n_kv_heads * hd, n_kv_heads * hd], dim=-1)
    q = q.view(B, T, n_heads, hd).transpose(1, 2)
    group = n_heads // n_kv_heads
    k = k.view(B, T, n_kv_heads, hd).transpose(1, 2).repeat_interleave(group, dim=1)
    v = v.view(B, T, n_kv_heads, hd).transpose(1, 2).repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return attn.proj((weights @ v).transpose(1, 2).reshape(B, T, d))


def check_gqa(
    attn: nn.Module, d_model: int, n_heads: int, n_kv_heads: int, tol: float = 1e-5
) -> None:
    """Grouped-query attention equals multi-head attention whose k/v heads are repeated copies
    (query head h reads k/v head h // (n_heads / n_kv_heads)); with n_kv_heads = n_heads it is
    plain multi-head attention."""
    hd = d_model // n_heads
    want = (n_heads + 2 * n_kv_heads) * hd
    got = tuple(attn.qkv.weight.shape)
    if got != (want, d_model):
        raise CheckFailed(
            f"the fused qkv projection should be ({want}, {d_model}) = ((n_heads + 2 n_kv_heads)"
            f" * head_dim, d) for {n_heads} query and {n_kv_heads} key/value heads, got {got}"
        )
    with probing(attn):
        x = torch.randn(2, 7, d_model)
        out = first(attn(x))
        expect_shape("attention output", out, x.shape)
        diff = (out - _written_out_gqa(attn, x, n_heads, n_kv_heads)).abs().max().item()
    if diff > tol:
        raise CheckFailed(
            f"attention with {n_kv_heads} key/value heads for {n_heads} query heads differs by "
            f"{diff:.3g} from multi-head attention with each k/v head repeated "
            f"{n_heads // n_kv_heads} times (query head h should read k/v head "
            f"h // {n_heads // n_kv_heads})"
        )


def check_swiglu_params(ff: nn.Module, d_model: int, d_ff: int, bias: bool = True) -> None:
    """A SwiGLU feed-forward keeps the shape and has 3 d f weights (+ 2 f + d biases): two input
    projections of width f (gate and up) and one output projection."""
    with probing(ff):
        x = torch.randn(2, 3, d_model)
        expect_shape("SwiGLU output", first(ff(x)), x.shape)
    n = count_module_params(ff)
    expected = 3 * d_model * d_ff + (2 * d_ff + d_model if bias else 0)
    if n != expected:
        plain = 2 * d_model * d_ff + (d_ff + d_model if bias else 0)
        hint = " (that is an ungated d -> f -> d feed-forward)" if n == plain else ""
        raise CheckFailed(
            f"SwiGLU feed-forward has {n:,} parameters, expected 3*d*f"
            f"{' + 2*f + d' if bias else ''} = {expected:,} (d={d_model}, f={d_ff}){hint}"
        )


BLOCK_OPTIONS: dict[str, tuple] = {
    "norm": ("layer", "rms"),
    "activation": ("gelu", "relu2", "swiglu"),
    "n_kv_heads": (None, 2, 1),
    "rope_theta": (None, 10000.0),
    "qk_norm": (False, True),
}


def check_block_combinations(make_block: Callable[..., nn.Module], d_model: int) -> int:
    """Causality and the residual identity for every combination of BLOCK_OPTIONS (pre-norm
    blocks); returns how many combinations passed."""
    names = list(BLOCK_OPTIONS)
    n = 0
    for values in itertools.product(*BLOCK_OPTIONS.values()):
        options = dict(zip(names, values, strict=True))
        block = make_block(**options)
        try:
            check_block_causality(block, d_model)
            check_residual_identity(block, d_model)
        except CheckFailed as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in options.items())
            raise CheckFailed(f"with {shown}: {exc}") from None
        n += 1
    return n

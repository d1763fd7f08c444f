"""The seeds' invariants as functions that take any module with the documented interface.

Each ``check_*`` function probes a module (lamina's own, or a learner's) with small random
inputs and raises ``CheckFailed`` with a message that says what is wrong and how far off it is;
it returns None when the invariant holds. Interfaces expected:

    norm(x) -> y                               x, y: (B, T, d)
    gelu(x) -> y                               elementwise
    ff(x) -> y                                 (B, T, d) -> (B, T, d)
    block(x) -> y or (y, weights)              (B, T, d) -> (B, T, d)
    embedding(ids, pos_offset=k) -> x          (B, T) -> (B, T, d)
    attn(x, padding_mask=m, need_weights=True) -> (out, weights (B, H, T, T))
    model(ids) -> logits                       (B, T) -> (B, T, vocab)

Checks run in eval mode with gradients off and restore the module's mode afterwards. They know
the interfaces, not lamina's classes (the parameter formula comes from ``models.params``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.checks.base import expect_shape, first, probing
from lamina.errors import CheckFailed
from lamina.models.config import GPTConfig
from lamina.models.params import count_module_params, count_params


def check_layer_norm(norm: nn.Module, d_model: int = 8, eps: float = 1e-5) -> None:
    """Mean 0 and biased variance 1 over the last dim; equal to F.layer_norm at init."""
    with probing(norm):
        x = torch.randn(4, 5, d_model) * 3 + 7
        y = first(norm(x))
        expect_shape("LayerNorm output", y, x.shape)
        mean = y.mean(-1).abs().max().item()
        if mean > 1e-4:
            raise CheckFailed(
                f"each vector should have mean 0 after normalisation: largest |mean| is {mean:.4f}"
            )
        var = y.var(-1, unbiased=False).mean().item()
        if abs(var - 1.0) > 1e-3 and abs(var - (d_model - 1) / d_model) < 1e-3:
            raise CheckFailed(
                "your LayerNorm uses the unbiased variance (divides by d - 1): "
                f"expected variance 1.000, got {var:.3f}"
            )
        for scale in (1.0, 0.003):  # a tiny scale makes eps matter
            xs = x * scale
            diff = (first(norm(xs)) - F.layer_norm(xs, (d_model,), eps=eps)).abs().max().item()
            if diff > 1e-4:
                raise CheckFailed(
                    f"differs from F.layer_norm(eps={eps}) by {diff:.2e} at input scale {scale} "
                    f"(variance of the output {var:.3f}; check eps, and that it is added to the "
                    "variance inside the square root)"
                )
        if abs(var - 1.0) > 1e-3:
            raise CheckFailed(f"expected variance 1.000, got {var:.3f}")


def check_gelu(gelu: Callable[[Tensor], Tensor]) -> None:
    """Equal to GELU's tanh approximation (GPT-2's), not the exact erf form."""
    with probing(gelu):
        t = torch.linspace(-6, 6, 241)
        y = gelu(t)
        diff = (y - F.gelu(t, approximate="tanh")).abs().max().item()
        if diff > 1e-5:
            hint = ""
            if (y - F.gelu(t)).abs().max().item() < 1e-5:
                hint = "this is the exact (erf) GELU; GPT-2 uses the tanh approximation: "
            raise CheckFailed(f"{hint}differs from F.gelu(approximate='tanh') by {diff:.2e}")


def check_feed_forward(ff: nn.Module, d_model: int = 16, d_ff: int | None = None) -> None:
    """Shape is kept and the parameters are d f + f + f d + d (f = 4 d by default)."""
    f = 4 * d_model if d_ff is None else d_ff
    with probing(ff):
        x = torch.randn(2, 3, d_model)
        expect_shape("feed-forward output", first(ff(x)), x.shape)
    n, expected = count_module_params(ff), 2 * d_model * f + f + d_model
    if n != expected:
        raise CheckFailed(
            f"feed-forward has {n:,} parameters, expected d*f + f + f*d + d = {expected:,} "
            f"(d={d_model}, f={f})"
        )


def check_block_causality(block: nn.Module, d_model: int, T: int = 10) -> None:
    """A block keeps the shape, and a change at the last position leaves earlier outputs alone."""
    with probing(block):
        h = torch.randn(2, T, d_model)
        y = first(block(h))
        expect_shape("block output", y, h.shape)
        h2 = h.clone()
        # a random change, not a constant shift: LayerNorm would erase a shift of all features
        h2[:, -1] = torch.randn(2, d_model) * 3
        diff = (first(block(h2))[:, :-1] - y[:, :-1]).abs().max().item()
        if diff > 1e-5:
            raise CheckFailed(
                "the block leaks information from a later token: outputs before the last position "
                f"changed by {diff:.3g} when only the last input changed (is the causal mask applied?)"
            )


def _sublayers(block: nn.Module) -> list[nn.Module]:
    """Children with parameters that are not norms: the attention and feed-forward sublayers."""
    return [
        m
        for m in block.children()
        if any(True for _ in m.parameters()) and "norm" not in type(m).__name__.lower()
    ]


def check_residual_identity(
    block: nn.Module, d_model: int, sublayers: list[nn.Module] | None = None
) -> None:
    """With every sublayer outputting zero, a pre-LN block returns its input exactly."""
    subs = _sublayers(block) if sublayers is None else sublayers
    if not subs:
        raise CheckFailed("found no sublayers (children with parameters that are not norms)")

    def zero(_m: nn.Module, _inp: tuple, out: Tensor | tuple) -> Tensor | tuple:
        if isinstance(out, tuple):
            return (torch.zeros_like(out[0]), *out[1:])
        return torch.zeros_like(out)

    handles = [m.register_forward_hook(zero) for m in subs]
    try:
        with probing(block):
            h = torch.randn(2, 6, d_model)
            diff = (first(block(h)) - h).abs().max().item()
    finally:
        for handle in handles:
            handle.remove()
    if diff > 1e-6:
        raise CheckFailed(
            "with both sublayers outputting zero a residual block must return its input; it moved "
            f"by {diff:.3g} (is a norm applied after the residual sum, or the residual missing?)"
        )


def check_embedding(embedding: nn.Module, vocab_size: int, block_size: int) -> None:
    """x = token part + position part; pos_offset continues positions exactly."""
    T = min(8, block_size)
    with probing(embedding):
        a = torch.full((1, T), 1 % vocab_size, dtype=torch.long)
        b = torch.full((1, T), 2 % vocab_size, dtype=torch.long)
        d = embedding(a) - embedding(b)  # token part difference, must not depend on position
        spread = (d - d[:, :1]).abs().max().item()
        if spread > 1e-5:
            raise CheckFailed(
                f"the token part varies with position by {spread:.3g}: x must be token + position"
            )
        if block_size < 8:
            return
        k, m = block_size // 4, block_size // 2  # a segment of m tokens starting at position k
        ids = torch.randint(0, vocab_size, (2, block_size))
        seg = embedding(ids[:, k : k + m], pos_offset=k)
        try:
            whole = embedding(ids)
        except (IndexError, RuntimeError) as exc:  # e.g. positions shifted past the table
            raise CheckFailed(_full_block_message(embedding, vocab_size, block_size, exc)) from exc
        diff = (seg - whole[:, k : k + m]).abs().max().item()
        if diff <= 1e-5:
            return
        same = torch.full((1, block_size), 1 % vocab_size, dtype=torch.long)
        full, seg = embedding(same), embedding(same[:, :m], pos_offset=k)
        for shift in (-2, -1, 1, 2):
            if (seg - full[:, k + shift : k + shift + m]).abs().max().item() <= 1e-5:
                raise CheckFailed(
                    f"pos_offset={k} placed the tokens at positions starting from {k + shift}, "
                    f"not {k}: off by {shift:+d}"
                )
        raise CheckFailed(
            f"embedding(ids[:, {k}:{k + m}], pos_offset={k}) differs from "
            f"embedding(ids)[:, {k}:{k + m}] by {diff:.3g}"
        )


def _full_block_message(
    embedding: nn.Module, vocab_size: int, block_size: int, exc: Exception
) -> str:
    """Why a full block of ids failed to embed: find the longest sequence that does embed."""
    longest = 0
    for T in range(block_size - 1, 0, -1):
        try:
            embedding(torch.zeros(1, T, dtype=torch.long) + 1 % vocab_size)
        except (IndexError, RuntimeError):
            continue
        longest = T
        break
    if longest:
        s = block_size - longest
        return (
            f"a full block of {block_size} tokens cannot be embedded, but {longest} can: the "
            f"positions start at {s}, not 0 (off by +{s}); a block needs positions 0 .. "
            f"{block_size - 1}"
        )
    return f"embedding a full block of {block_size} tokens raised {type(exc).__name__}: {exc}"


def check_tied(token_table: Tensor, head_weight: Tensor) -> None:
    """The head's weight is the token table itself (shared storage), not a copy."""
    if head_weight is token_table or head_weight.data_ptr() == token_table.data_ptr():
        return
    if head_weight.shape == token_table.shape and torch.equal(head_weight, token_table):
        raise CheckFailed(
            "the head's weight is a copy of the token table, not shared: the two will drift "
            "apart in training (assign head.weight = token_table, the same Parameter)"
        )
    raise CheckFailed("the head's weight and the token table are different tensors")


def check_attention_weights(attn: nn.Module, d_model: int, *, causal: bool, T: int = 6) -> None:
    """Rows sum to 1; padded keys (and future keys if causal) get exactly zero probability."""
    with probing(attn):
        x = torch.randn(2, T, d_model)
        pad = torch.zeros(2, T, dtype=torch.bool)
        pad[1, T - 2 :] = True  # the second sequence ends with two pads
        out = attn(x, padding_mask=pad, need_weights=True)
        if not isinstance(out, tuple) or len(out) < 2 or out[1] is None:
            raise CheckFailed("attention must return (output, weights) when need_weights=True")
        y, w = out[0], out[1]
        expect_shape("attention output", y, x.shape)
        if w.dim() != 4 or w.shape[0] != 2 or tuple(w.shape[2:]) != (T, T):
            raise CheckFailed(
                f"weights must be (B, H, T, T) = (2, H, {T}, {T}), got {tuple(w.shape)}"
            )
        rows = (w.sum(-1) - 1).abs().max().item()
        if rows > 1e-5:
            raise CheckFailed(f"attention rows must sum to 1; the worst is off by {rows:.3g}")
        leaked = w[1, :, :, T - 2 :].abs().max().item()
        if leaked != 0.0:
            raise CheckFailed(
                f"padded keys must get exactly zero probability, got up to {leaked:.3g}"
            )
        if causal:
            future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
            peek = w[:, :, future].abs().max().item()
            if peek != 0.0:
                raise CheckFailed(
                    f"future keys must get exactly zero probability (missing causal mask?): got up to {peek:.3g}"
                )


def check_logits_shape(model: nn.Module, vocab_size: int, T: int = 12) -> None:
    with probing(model):
        logits = first(model(torch.randint(0, vocab_size, (3, T))))
        expect_shape("logits", logits, (3, T, vocab_size))


def check_param_formula(model: nn.Module, config: GPTConfig) -> None:
    """Counted parameters (shared tensors once) equal the formula."""
    n, expected = count_module_params(model), count_params(config)
    if n != expected:
        raise CheckFailed(
            f"the model has {n:,} parameters, the formula says {expected:,} "
            f"(off by {n - expected:+,}; a copied rather than shared head adds vocab*d)"
        )


def check_greedy(
    generate: Callable[[Tensor, int], Tensor], vocab_size: int, block_size: int
) -> None:
    """Greedy decoding keeps the prompt, is deterministic, stays in range and runs past block_size."""
    prompt = torch.tensor([[1, 2, 3]]) % vocab_size
    n = block_size + 8  # forces cropping to the context
    with torch.no_grad():
        out = generate(prompt, n)
        again = generate(prompt, n)
    expect_shape("generated ids", out, (1, 3 + n))
    if not torch.equal(out[:, :3], prompt):
        raise CheckFailed("the prompt must be kept at the start of the output")
    if not torch.equal(out, again):
        raise CheckFailed("greedy decoding of an eval-mode model must be deterministic")
    if int(out.min()) < 0 or int(out.max()) >= vocab_size:
        raise CheckFailed(f"generated ids must lie in [0, {vocab_size})")


def check_initial_loss(model: nn.Module, vocab_size: int, T: int = 16, tol: float = 0.25) -> None:
    """An untrained model's cross-entropy is about ln(vocab): within tol (relative)."""
    with probing(model):
        ids = torch.randint(0, vocab_size, (4, T))
        targets = torch.randint(0, vocab_size, (4, T))
        logits = first(model(ids))
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).item()
    expected = math.log(vocab_size)
    if abs(loss - expected) > tol * expected:
        raise CheckFailed(
            f"initial loss {loss:.3f} is far from ln(vocab) = {expected:.3f}: the init is too large "
            "or the logits are scaled"
        )


def check_fast_path_matches_reference(attn: nn.Module, d_model: int, tol: float = 1e-5) -> None:
    """lamina's SDPA path equals its explicit-softmax path (with and without a padding mask)."""
    saved = attn.impl
    try:
        with probing(attn):
            x = torch.randn(2, 7, d_model)
            pad = torch.zeros(2, 7, dtype=torch.bool)
            pad[0, 5:] = True
            pad[1, :] = True  # a fully padded row must give finite zeros on both paths
            for mask in (None, pad):
                attn.impl = "sdpa"
                fast = attn(x, mask)[0]
                attn.impl = "reference"
                ref = attn(x, mask)[0]
                if not torch.isfinite(fast).all() or not torch.isfinite(ref).all():
                    raise CheckFailed("attention produced non-finite values on a padded batch")
                diff = (fast - ref).abs().max().item()
                if diff > tol:
                    raise CheckFailed(f"SDPA path differs from the reference path by {diff:.2e}")
    finally:
        attn.impl = saved

"""``run_all()``: every probe on lamina's own modules, in layer order (what ``lamina check`` prints)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lamina.attention import MultiHeadAttention
from lamina.block import GELU, FeedForward, LayerNorm, TransformerBlock
from lamina.checks.probes import (
    check_attention_weights,
    check_block_causality,
    check_embedding,
    check_fast_path_matches_reference,
    check_feed_forward,
    check_gelu,
    check_greedy,
    check_initial_loss,
    check_layer_norm,
    check_logits_shape,
    check_param_formula,
    check_residual_identity,
    check_tied,
)
from lamina.embedding import Embedding
from lamina.errors import CheckFailed
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT


@dataclass
class CheckResult:
    name: str
    ok: bool
    message: str = ""


def run_all(seed: int = 0) -> list[CheckResult]:
    """Every check on lamina's own modules, in layer order."""
    torch.manual_seed(seed)
    cfg = GPTConfig.preset("tiny")
    d = cfg.d_model
    model = GPT(cfg)
    untied = GPT(cfg.replace(tie_weights=False, qkv_bias=False))
    checks: list[tuple[str, Callable[[], None]]] = [
        (
            "embedding: token + position, pos_offset",
            lambda: check_embedding(
                Embedding(cfg.vocab_size, cfg.block_size, d), cfg.vocab_size, cfg.block_size
            ),
        ),
        (
            "embedding: sinusoidal positions",
            lambda: check_embedding(
                Embedding(cfg.vocab_size, cfg.block_size, d, positions="sinusoidal"),
                cfg.vocab_size,
                cfg.block_size,
            ),
        ),
        (
            "attention: causal weights",
            lambda: check_attention_weights(MultiHeadAttention(d, 4, causal=True), d, causal=True),
        ),
        (
            "attention: padding weights",
            lambda: check_attention_weights(MultiHeadAttention(d, 4), d, causal=False),
        ),
        (
            "attention: fast path = reference",
            lambda: check_fast_path_matches_reference(MultiHeadAttention(d, 4, causal=True), d),
        ),
        ("block: LayerNorm statistics", lambda: check_layer_norm(LayerNorm(8), 8)),
        ("block: GELU (tanh)", lambda: check_gelu(GELU())),
        ("block: feed-forward parameters", lambda: check_feed_forward(FeedForward(16), 16)),
        ("block: shape and causality", lambda: check_block_causality(TransformerBlock(d, 4), d)),
        ("block: residual identity", lambda: check_residual_identity(TransformerBlock(d, 4), d)),
        ("gpt: logits shape", lambda: check_logits_shape(model, cfg.vocab_size)),
        (
            "gpt: head tied to token table",
            lambda: check_tied(model.embed.wte.weight, model.head.weight),
        ),
        ("gpt: parameter formula (tied)", lambda: check_param_formula(model, cfg)),
        (
            "gpt: parameter formula (untied, no qkv bias)",
            lambda: check_param_formula(untied, untied.config),
        ),
        (
            "gpt: greedy decoding",
            lambda: check_greedy(model.greedy, cfg.vocab_size, cfg.block_size),
        ),
        ("gpt: initial loss ~ ln(vocab)", lambda: check_initial_loss(model, cfg.vocab_size)),
    ]
    results = []
    for name, fn in checks:
        try:
            fn()
            results.append(CheckResult(name, True))
        except CheckFailed as exc:
            results.append(CheckResult(name, False, str(exc)))
    return results

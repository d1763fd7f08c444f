"""``run_all()``: every probe on lamina's own modules, in layer order (what ``lamina check`` prints)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lamina.attention import MultiHeadAttention, apply_rotary, rotary_tables
from lamina.block import GELU, FeedForward, LayerNorm, RMSNorm, TransformerBlock
from lamina.checks.modern import (
    check_block_combinations,
    check_gqa,
    check_rms_norm,
    check_rope,
    check_swiglu_params,
)
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
        *_modern_checks(cfg),
    ]
    results = []
    for name, fn in checks:
        try:
            fn()
            results.append(CheckResult(name, True))
        except CheckFailed as exc:
            results.append(CheckResult(name, False, str(exc)))
    return results


def _modern_checks(cfg: GPTConfig) -> list[tuple[str, Callable[[], None]]]:
    """The modern layers' probes: RMSNorm, RoPE, GQA, SwiGLU, every block combination, and
    llama-tiny's formula and starting loss."""
    d = cfg.d_model
    llama = GPT(GPTConfig.preset("llama-tiny", vocab_size=cfg.vocab_size, d_model=d))

    def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return apply_rotary(x, *rotary_tables(positions, x.shape[-1]))

    def gqa(n_kv: int) -> Callable[[], None]:
        attn = MultiHeadAttention(d, 4, causal=True, n_kv_heads=n_kv)
        return lambda: check_gqa(attn, d, 4, n_kv)

    def block(**options: object) -> TransformerBlock:
        return TransformerBlock(d, 4, **options)  # type: ignore[arg-type]

    def every_block() -> None:
        check_block_combinations(block, d)

    return [
        ("block: RMSNorm statistics", lambda: check_rms_norm(RMSNorm(8), 8)),
        ("attention: RoPE scores depend only on i - j", lambda: check_rope(rotate, 16)),
        ("attention: GQA, n_kv_heads = n_heads is MHA", gqa(4)),
        ("attention: GQA = MHA with repeated k/v heads", gqa(2)),
        ("attention: multi-query (n_kv_heads = 1)", gqa(1)),
        (
            "attention: fast path = reference (GQA, RoPE, QK-norm)",
            lambda: check_fast_path_matches_reference(
                MultiHeadAttention(d, 4, causal=True, n_kv_heads=2, rope_theta=1e4, qk_norm=True),
                d,
            ),
        ),
        (
            "block: SwiGLU parameters",
            lambda: check_swiglu_params(FeedForward(16, 24, activation="swiglu"), 16, 24),
        ),
        (
            "block: causality + residual identity, every option",
            every_block,
        ),
        ("llama-tiny: parameter formula", lambda: check_param_formula(llama, llama.config)),
        (
            "llama-tiny: initial loss ~ ln(vocab)",
            lambda: check_initial_loss(llama, cfg.vocab_size),
        ),
    ]

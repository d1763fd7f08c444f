"""Invariant checks, reusable on any module with the documented interface: two products.

    probes.py    the seeds' invariants (LayerNorm statistics, GELU, feed-forward size, block
                 causality and residual identity, embedding decomposition and offset, attention
                 rows, logits shape, parameter formula, tied storage, greedy determinism, initial
                 loss ~ ln(vocab), fast path = reference); suite.py runs them all on lamina's own
                 modules (`run_all`, what `lamina check` prints)
    modern.py    the same for Llama's layers: RMSNorm statistics, RoPE's relative scores and
                 kept norms, GQA = MHA with repeated k/v heads, SwiGLU's size, and block
                 causality + residual identity for every combination of options
    learners.py  `report` and the checks of the pieces a learner writes in the lessons, with
                 messages that guess the mistake
    finetuning.py  the same for lesson 7: a chat rendered by hand, a LoRA linear (against
                 lamina's), the assistant-only loss mask (against the tokenizer's)
    speed.py     the same for lesson 8: a Q4_0 block quantizer and its dot product (against
                 gguf.quants and lamina's own kernel), a KV cache step (against lamina's
                 attention with its KVCache)
    base.py      what they share (probing in eval mode, shape messages)

Everything is re-exported here: ``checks.check_layer_norm(MyLayerNorm(8), 8)``.
"""

from __future__ import annotations

from lamina.checks.finetuning import check_assistant_mask, check_chat_render, check_lora_linear
from lamina.checks.learners import (
    check_cached_generation,
    check_causal_mask,
    check_char_tokenizer,
    check_sampler,
    check_train_step,
    report,
)
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
from lamina.checks.speed import check_cache_step, check_q4_0_matvec, check_q4_0_quantize
from lamina.checks.suite import CheckResult, run_all

__all__ = [
    "CheckResult",
    "check_assistant_mask",
    "check_attention_weights",
    "check_block_combinations",
    "check_block_causality",
    "check_cache_step",
    "check_cached_generation",
    "check_causal_mask",
    "check_char_tokenizer",
    "check_chat_render",
    "check_embedding",
    "check_fast_path_matches_reference",
    "check_feed_forward",
    "check_gelu",
    "check_gqa",
    "check_greedy",
    "check_initial_loss",
    "check_layer_norm",
    "check_logits_shape",
    "check_lora_linear",
    "check_param_formula",
    "check_q4_0_matvec",
    "check_q4_0_quantize",
    "check_residual_identity",
    "check_rms_norm",
    "check_rope",
    "check_sampler",
    "check_swiglu_params",
    "check_tied",
    "check_train_step",
    "report",
    "run_all",
]

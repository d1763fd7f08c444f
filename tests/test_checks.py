"""lamina.checks: every check passes on lamina's modules and catches the classic mistakes."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lamina import checks
from lamina.block import FeedForward, LayerNorm, TransformerBlock
from lamina.embedding import Embedding
from lamina.errors import CheckFailed
from lamina.models import GPT, GPTConfig


def test_every_check_passes_on_lamina_itself():
    results = checks.run_all()
    assert len(results) >= 15
    assert [r.name for r in results if not r.ok] == []


class UnbiasedLayerNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.scale, self.shift = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x):
        m, v = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=True)
        return self.scale * (x - m) / torch.sqrt(v + 1e-5) + self.shift


def test_unbiased_variance_is_named():
    with pytest.raises(CheckFailed, match="unbiased variance.*expected variance 1.000, got 0.875"):
        checks.check_layer_norm(UnbiasedLayerNorm(8), 8)


def test_wrong_eps_is_caught():
    with pytest.raises(CheckFailed, match="eps"):
        checks.check_layer_norm(nn.LayerNorm(8, eps=1e-2), 8)


def test_exact_gelu_is_told_apart_from_tanh():
    with pytest.raises(CheckFailed, match="exact \\(erf\\) GELU"):
        checks.check_gelu(F.gelu)


def test_feed_forward_without_biases_is_counted_wrong():
    with pytest.raises(CheckFailed, match="expected d\\*f \\+ f \\+ f\\*d \\+ d = 2,128"):
        checks.check_feed_forward(FeedForward(16, bias=False), 16)


def test_missing_causal_mask_is_caught():
    blk = TransformerBlock(32, 4, causal=False)
    with pytest.raises(CheckFailed, match="leaks information from a later token"):
        checks.check_block_causality(blk, 32)


def test_post_ln_block_fails_residual_identity():
    with pytest.raises(CheckFailed, match="return its input"):
        checks.check_residual_identity(TransformerBlock(32, 4, norm_first=False), 32)


class OffByOne(Embedding):
    def forward(self, ids, pos_offset=0, positions=None):
        shift = 1 if pos_offset else 0
        return super().forward(ids, positions=torch.arange(ids.shape[1]) + pos_offset + shift)


def test_off_by_one_position_offset_is_caught():
    with pytest.raises(CheckFailed, match="off by \\+1"):
        checks.check_embedding(OffByOne(50, 32, 16), 50, 32)


def test_copied_rather_than_shared_tied_weight_is_caught():
    model = GPT(GPTConfig.preset("tiny", tie_weights=False))
    with torch.no_grad():
        model.head.weight.copy_(model.embed.wte.weight)
    with pytest.raises(CheckFailed, match="copy of the token table, not shared"):
        checks.check_tied(model.embed.wte.weight, model.head.weight)
    with pytest.raises(CheckFailed, match="copied rather than shared"):
        checks.check_param_formula(model, model.config.replace(tie_weights=True))


class LeakyAttention(nn.Module):
    """Masks pads with a finite -1e4 after softmax-unsafe scaling: pads get tiny probability."""

    def __init__(self, d, h):
        super().__init__()
        self.inner = nn.MultiheadAttention(d, h, batch_first=True)

    def forward(self, x, padding_mask=None, need_weights=False):
        bias = padding_mask[:, None, :].float() * -10.0  # too weak to zero pads
        mask = bias.repeat_interleave(self.inner.num_heads, 0).expand(-1, x.shape[1], -1)
        y, w = self.inner(x, x, x, attn_mask=mask, average_attn_weights=False)
        return y, w


def test_pads_that_get_some_probability_are_caught():
    with pytest.raises(CheckFailed, match="padded keys must get exactly zero"):
        checks.check_attention_weights(LeakyAttention(32, 4), 32, causal=False)


def test_attention_without_causal_mask_is_caught_by_weights():
    from lamina.attention import MultiHeadAttention

    with pytest.raises(CheckFailed, match="missing causal mask"):
        checks.check_attention_weights(MultiHeadAttention(32, 4), 32, causal=True)


def test_scaled_up_logits_fail_the_initial_loss_check():
    model = GPT(GPTConfig.preset("tiny"))
    with torch.no_grad():
        model.embed.wte.weight.mul_(50)
    with pytest.raises(CheckFailed, match=f"ln\\(vocab\\) = {math.log(100):.3f}"):
        checks.check_initial_loss(model, 100)


def test_non_deterministic_generation_is_caught():
    calls = iter(range(100))

    def jittery(prompt, n):
        torch.manual_seed(next(calls))
        return torch.cat([prompt, torch.randint(0, 10, (1, n))], 1)

    with pytest.raises(CheckFailed, match="deterministic"):
        checks.check_greedy(jittery, 10, 8)


def test_checks_restore_training_mode():
    ln = LayerNorm(8).train()
    checks.check_layer_norm(ln, 8)
    assert ln.training

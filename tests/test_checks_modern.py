"""lamina.checks for the modern layers: pass on lamina's own, catch the classic mistakes."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lamina import checks
from lamina.attention import MultiHeadAttention, apply_rotary, rotary_tables
from lamina.block import FeedForward, RMSNorm, TransformerBlock
from lamina.errors import CheckFailed


def test_lamina_check_lists_the_modern_checks_as_passing():
    results = {r.name: r for r in checks.run_all()}
    modern = [n for n in results if any(k in n for k in ("RMSNorm", "RoPE", "GQA", "SwiGLU"))]
    assert len(modern) >= 5
    assert all(results[n].ok for n in modern)
    assert results["block: causality + residual identity, every option"].ok


def test_rms_norm_passes_and_layer_norm_is_named():
    checks.check_rms_norm(RMSNorm(8), 8)
    checks.check_rms_norm(nn.RMSNorm(8, eps=1e-5), 8)
    with pytest.raises(CheckFailed, match="subtracts the mean"):
        checks.check_rms_norm(nn.LayerNorm(8), 8)


def test_rms_norm_divided_by_the_norm_not_the_rms_is_caught():
    class ByNorm(nn.Module):
        def forward(self, x):
            return x / x.norm(dim=-1, keepdim=True)

    with pytest.raises(CheckFailed, match=r"root mean square 1.*off by up to 0\.64"):
        checks.check_rms_norm(ByNorm(), 8)


def rope(x, positions):
    return apply_rotary(x, *rotary_tables(positions, x.shape[-1]))


def test_rope_passes_and_a_rotation_by_absolute_offsets_is_caught():
    checks.check_rope(rope, 16)

    def per_position_noise(x, positions):  # an absolute position signal, not a rotation
        return x + 0.1 * positions[:, None].float()

    with pytest.raises(CheckFailed, match="shifting both positions by 7 changed"):
        checks.check_rope(per_position_noise, 16)


def test_rope_that_scales_vectors_or_does_nothing_is_caught():
    def scaled(x, positions):
        cos, sin = rotary_tables(positions, x.shape[-1])
        return apply_rotary(x, cos, sin) * 1.5

    def nothing(x, positions):
        return x

    def different_q_k(x, positions):  # rotates by position squared: not relative
        return rope(x, positions**2)

    with pytest.raises(CheckFailed, match="shifting both"):
        checks.check_rope(different_q_k, 16)
    with pytest.raises(CheckFailed, match="does nothing"):
        checks.check_rope(nothing, 16)
    with pytest.raises(CheckFailed, match="shifting both|norm"):
        checks.check_rope(scaled, 16)


@pytest.mark.parametrize("n_kv", [4, 2, 1])
def test_gqa_passes_on_lamina_attention(n_kv):
    checks.check_gqa(MultiHeadAttention(32, 4, causal=True, n_kv_heads=n_kv), 32, 4, n_kv)


def test_gqa_with_the_wrong_head_mapping_is_caught():
    """A learner's GQA that tiles k/v heads (h % n_kv) instead of repeating them (h // g)."""

    class Tiled(MultiHeadAttention):
        def forward(self, x):
            B, T, d = x.shape
            H, Hkv, hd = self.n_heads, self.n_kv_heads, self.head_dim
            q, k, v = self.qkv(x).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
            q = q.view(B, T, H, hd).transpose(1, 2)
            k = k.view(B, T, Hkv, hd).transpose(1, 2).repeat(1, H // Hkv, 1, 1)
            v = v.view(B, T, Hkv, hd).transpose(1, 2).repeat(1, H // Hkv, 1, 1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(out.transpose(1, 2).reshape(B, T, d)), None

    torch.manual_seed(0)
    with pytest.raises(
        CheckFailed, match=r"differs by .*\(query head h should read k/v head h // 2\)"
    ):
        checks.check_gqa(Tiled(32, 4, causal=True, n_kv_heads=2), 32, 4, 2)
    with pytest.raises(CheckFailed, match=r"should be \(64, 32\)"):
        checks.check_gqa(MultiHeadAttention(32, 4, causal=True), 32, 4, 2)


def test_swiglu_params_pass_and_an_ungated_feed_forward_is_named():
    checks.check_swiglu_params(FeedForward(16, 24, activation="swiglu"), 16, 24)
    checks.check_swiglu_params(FeedForward(16, 24, activation="swiglu", bias=False), 16, 24, False)
    with pytest.raises(CheckFailed, match="ungated"):
        checks.check_swiglu_params(FeedForward(16, 24, activation="gelu"), 16, 24)


def test_block_combinations_name_the_failing_options():
    assert checks.check_block_combinations(lambda **kw: TransformerBlock(16, 4, **kw), 16) == 72

    def leaky(**kw):
        block = TransformerBlock(16, 4, **kw)
        if kw["activation"] == "swiglu" and kw["n_kv_heads"] == 1:
            block.attn.causal = False
        return block

    with pytest.raises(CheckFailed, match="activation='swiglu', n_kv_heads=1.*leaks"):
        checks.check_block_combinations(leaky, 16)

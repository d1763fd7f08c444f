"""Layer 3: LayerNorm, GELU, feed-forward, pre-LN / post-LN blocks (seed notebook checks 1-3)."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lamina.block import (
    GELU,
    FeedForward,
    LayerNorm,
    RMSNorm,
    TransformerBlock,
    gelu_formula,
    rms_norm_formula,
)
from lamina.errors import LaminaError


def test_layer_norm_gives_mean_zero_and_biased_variance_one():
    torch.manual_seed(0)
    x = torch.randn(4, 5, 8) * 3 + 7
    y = LayerNorm(8)(x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(4, 5), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(4, 5), atol=1e-3, rtol=0)


def test_layer_norm_equals_the_written_out_formula():
    """weight * (x - mean) / sqrt(var_biased + 1e-5) + bias, with trained-looking parameters."""
    torch.manual_seed(0)
    ln = LayerNorm(16)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    x = torch.randn(3, 7, 16) * 0.01  # small inputs: eps matters
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, unbiased=False)
    expected = ln.weight * (x - mean) / torch.sqrt(var + 1e-5) + ln.bias
    torch.testing.assert_close(ln(x), expected, atol=1e-5, rtol=1e-5)


def test_gelu_is_the_tanh_approximation():
    t = torch.linspace(-6, 6, 101)
    torch.testing.assert_close(GELU()(t), gelu_formula(t), atol=1e-6, rtol=0)
    torch.testing.assert_close(GELU()(t), F.gelu(t, approximate="tanh"), atol=1e-6, rtol=0)
    assert abs(GELU()(torch.tensor(1.0)).item() - 0.8412) < 1e-3


def test_feed_forward_keeps_shape_and_has_the_formula_parameters():
    ff = FeedForward(16)
    assert ff(torch.randn(2, 3, 16)).shape == (2, 3, 16)
    assert sum(p.numel() for p in ff.parameters()) == 16 * 64 + 64 + 64 * 16 + 16


def test_feed_forward_width_and_activation_are_configurable():
    ff = FeedForward(8, 24, activation="relu")
    assert ff.fc.out_features == 24 and isinstance(ff.act, nn.ReLU)
    with pytest.raises(LaminaError, match="activation"):
        FeedForward(8, activation="swish")


@pytest.mark.parametrize("norm_first", [True, False])
def test_block_keeps_shape_and_is_causal(norm_first):
    """A change at the last position must not change any earlier output."""
    torch.manual_seed(0)
    blk = TransformerBlock(32, 4, norm_first=norm_first).eval()
    h = torch.randn(2, 10, 32)
    y, _ = blk(h)
    assert y.shape == h.shape
    h2 = h.clone()
    h2[:, -1] += 5.0
    torch.testing.assert_close(blk(h2)[0][:, :-1], y[:, :-1], atol=1e-5, rtol=0)


def test_pre_ln_block_with_zeroed_sublayers_returns_its_input():
    """Residual identity: with both sublayer outputs zero, x comes back exactly."""
    blk = TransformerBlock(32, 4).eval()
    for p in list(blk.attn.proj.parameters()) + list(blk.ff.proj.parameters()):
        nn.init.zeros_(p)
    h = torch.randn(2, 10, 32)
    torch.testing.assert_close(blk(h)[0], h, atol=1e-6, rtol=0)


def copy_into_torch_layer(ours: TransformerBlock, ref: nn.TransformerEncoderLayer) -> None:
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(ours.attn.qkv.weight)
        ref.self_attn.in_proj_bias.copy_(ours.attn.qkv.bias)
        ref.self_attn.out_proj.weight.copy_(ours.attn.proj.weight)
        ref.self_attn.out_proj.bias.copy_(ours.attn.proj.bias)
        ref.linear1.weight.copy_(ours.ff.fc.weight)
        ref.linear1.bias.copy_(ours.ff.fc.bias)
        ref.linear2.weight.copy_(ours.ff.proj.weight)
        ref.linear2.bias.copy_(ours.ff.proj.bias)
        for mine, theirs in ((ours.norm1, ref.norm1), (ours.norm2, ref.norm2)):
            mine.weight.uniform_(0.5, 1.5)
            mine.bias.uniform_(-0.5, 0.5)
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("impl", ["sdpa", "reference"])
def test_matches_torch_transformer_encoder_layer(norm_first, with_mask, impl):
    """Parity with nn.TransformerEncoderLayer(batch_first=True), copied weights, within 1e-5."""
    torch.manual_seed(0)
    d, h, f = 64, 4, 128
    ours = TransformerBlock(d, h, d_ff=f, norm_first=norm_first, causal=False, activation="relu")
    ref = nn.TransformerEncoderLayer(d, h, f, dropout=0.0, batch_first=True, norm_first=norm_first)
    copy_into_torch_layer(ours, ref)
    ours.eval(), ref.eval()
    ours.attn.impl = impl
    x = torch.randn(3, 7, d)
    pad = None
    if with_mask:
        pad = torch.zeros(3, 7, dtype=torch.bool)
        pad[1, 5:] = True
        pad[2, 3:] = True
    expected = ref(x, src_key_padding_mask=pad)
    got, _ = ours(x, pad)
    if pad is not None:  # torch's fast path may zero pad rows; compare real positions
        keep = ~pad
        got, expected = got[keep], expected[keep]
    assert (got - expected).abs().max().item() < 1e-5


def test_dropout_makes_training_mode_stochastic_and_eval_deterministic():
    blk = TransformerBlock(32, 4, dropout=0.3)
    x = torch.randn(2, 6, 32)
    blk.eval()
    assert torch.equal(blk(x)[0], blk(x)[0])
    blk.train()
    assert not torch.equal(blk(x)[0], blk(x)[0])


def test_attn_dropout_sets_the_attention_weights_dropout_alone():
    """None: the attention weights get `dropout`; 0: the residual and feed-forward dropouts
    stay, the attention (SDPA's fused kernel) has none, so the block is still stochastic."""
    from lamina import GPT, GPTConfig

    assert TransformerBlock(32, 4, dropout=0.3).attn.dropout == 0.3
    blk = TransformerBlock(32, 4, dropout=0.3, attn_dropout=0.0)
    assert blk.attn.dropout == 0.0 and blk.drop1.p == blk.drop2.p == blk.ff.drop.p == 0.3
    blk.train()
    x = torch.randn(2, 6, 32)
    assert not torch.equal(blk(x)[0], blk(x)[0])
    cfg = GPTConfig(vocab_size=16, block_size=8, d_model=32, n_heads=4, n_layers=2, dropout=0.2)
    assert [b.attn.dropout for b in GPT(cfg).blocks] == [0.2, 0.2]
    model = GPT(cfg.replace(attn_dropout=0.0))
    assert [b.attn.dropout for b in model.blocks] == [0.0, 0.0] and model.embed.drop.p == 0.2


def test_block_returns_attention_weights_on_request():
    blk = TransformerBlock(32, 4).eval()
    y, w = blk(torch.randn(2, 6, 32), need_weights=True)
    assert w.shape == (2, 4, 6, 6)
    assert math.isclose(w[0, 0, 3].sum().item(), 1.0, abs_tol=1e-6)


def test_rms_norm_gives_root_mean_square_one_without_centring():
    torch.manual_seed(0)
    x = torch.randn(4, 5, 8) * 3 + 7
    y = RMSNorm(8)(x)
    torch.testing.assert_close(y.pow(2).mean(-1).sqrt(), torch.ones(4, 5), atol=1e-4, rtol=0)
    assert y.mean(-1).abs().min() > 0.5  # not centred: the mean survives
    torch.testing.assert_close(y, rms_norm_formula(x), atol=1e-6, rtol=0)


def test_rms_norm_with_gain_equals_the_formula_and_without_gain_has_no_parameters():
    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 7, 16) * 0.001  # small inputs: eps matters
    torch.testing.assert_close(norm(x), norm.weight * rms_norm_formula(x, 1e-6))
    assert sum(p.numel() for p in RMSNorm(16, gain=False).parameters()) == 0
    assert sum(p.numel() for p in LayerNorm(16, gain=False).parameters()) == 16  # the shift


def test_gelu_exact_is_the_erf_form_and_gelu_the_tanh_form():
    t = torch.linspace(-4, 4, 33)
    exact = FeedForward(8, 12, activation="gelu_exact").act(t)
    torch.testing.assert_close(exact, 0.5 * t * (1 + torch.erf(t / math.sqrt(2.0))))
    torch.testing.assert_close(FeedForward(8, 12).act(t), gelu_formula(t))


def test_relu2_is_relu_squared():
    ff = FeedForward(8, 12, activation="relu2")
    t = torch.linspace(-3, 3, 13)
    torch.testing.assert_close(ff.act(t), torch.relu(t) ** 2)


def test_swiglu_has_two_input_projections_of_width_d_ff():
    """silu(x W_gate) * (x W_up) W_down: 3 d f weights (+ 2 f + d biases)."""
    torch.manual_seed(0)
    d, f = 8, 12
    ff = FeedForward(d, f, activation="swiglu")
    assert sum(p.numel() for p in ff.parameters()) == 3 * d * f + 2 * f + d
    assert (
        sum(p.numel() for p in FeedForward(d, f, activation="swiglu", bias=False).parameters())
        == 3 * d * f
    )
    x = torch.randn(2, 3, d)
    gate, up = ff.fc.weight[:f], ff.fc.weight[f:]
    hidden = F.silu(x @ gate.T + ff.fc.bias[:f]) * (x @ up.T + ff.fc.bias[f:])
    torch.testing.assert_close(ff(x), ff.proj(hidden))


MODERN_BLOCKS = [
    dict(norm=norm, activation=act, n_kv_heads=kv, rope_theta=theta, qk_norm=qk, norm_gain=gain)
    for norm in ("layer", "rms")
    for act in ("gelu", "relu2", "swiglu")
    for kv, theta, qk, gain in (
        (None, None, False, True),
        (2, 1e4, True, False),
        (1, 1e4, False, True),
    )
]


@pytest.mark.parametrize("kw", MODERN_BLOCKS)
@pytest.mark.parametrize("norm_first", [True, False])
def test_every_combination_is_causal(kw, norm_first):
    torch.manual_seed(0)
    blk = TransformerBlock(32, 4, norm_first=norm_first, **kw).eval()
    h = torch.randn(2, 10, 32)
    y, _ = blk(h)
    h2 = h.clone()
    h2[:, -1] += 5.0
    torch.testing.assert_close(blk(h2)[0][:, :-1], y[:, :-1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kw", MODERN_BLOCKS)
def test_every_pre_norm_combination_with_zeroed_sublayers_returns_its_input(kw):
    blk = TransformerBlock(32, 4, **kw).eval()
    for p in list(blk.attn.proj.parameters()) + list(blk.ff.proj.parameters()):
        nn.init.zeros_(p)
    h = torch.randn(2, 10, 32)
    torch.testing.assert_close(blk(h)[0], h, atol=1e-6, rtol=0)

"""Layer 2: multi-head self-attention (masks, weights, fast path = reference path, KV cache)."""

import pytest
import torch
from torch import nn

from lamina.attention import KVCache, MultiHeadAttention
from lamina.errors import LaminaError

D, H = 32, 4


def make(causal=False, **kw):
    torch.manual_seed(0)
    return MultiHeadAttention(D, H, causal=causal, **kw).eval()


def run(attn, x, impl, **kw):
    attn.impl = impl
    return attn(x, **kw)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_fast_path_equals_reference_path(causal, with_mask, training):
    """SDPA and the explicit softmax agree within 1e-5 (fp32), with and without masks."""
    attn = make(causal=causal)
    attn.train(training)  # dropout is 0: training mode must still agree
    x = torch.randn(3, 9, D)
    pad = None
    if with_mask:
        pad = torch.zeros(3, 9, dtype=torch.bool)
        pad[0, 6:] = True
        pad[1, :2] = True
    fast, _ = run(attn, x, "sdpa", padding_mask=pad)
    ref, _ = run(attn, x, "reference", padding_mask=pad)
    assert (fast - ref).abs().max().item() < 1e-5


def test_attention_weights_rows_sum_to_one_and_masked_keys_get_exactly_zero():
    """The seed encoder's invariant: (B, H, T, T) weights, rows sum to 1, pads get 0."""
    attn = make()
    ids_like = torch.tensor([[1, 2, 3, 4, 0], [5, 6, 7, 0, 0]])
    pad = ids_like.eq(0)
    _, w = attn(torch.randn(2, 5, D), padding_mask=pad, need_weights=True)
    assert w.shape == (2, H, 5, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, H, 5))
    assert torch.count_nonzero(w.masked_select(pad[:, None, None, :].expand_as(w))) == 0


def test_causal_weights_are_zero_above_the_diagonal():
    _, w = make(causal=True)(torch.randn(2, 6, D), need_weights=True)
    upper = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    assert torch.count_nonzero(w[..., upper]) == 0


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
def test_causal_output_ignores_later_positions(impl):
    """Changing the last input leaves every earlier output unchanged."""
    attn = make(causal=True)
    x = torch.randn(2, 8, D)
    x2 = x.clone()
    x2[:, -1] += 3.0
    a, _ = run(attn, x, impl)
    b, _ = run(attn, x2, impl)
    torch.testing.assert_close(a[:, :-1], b[:, :-1])
    assert (a[:, -1] - b[:, -1]).abs().max() > 1e-3


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
def test_padded_keys_do_not_change_real_outputs(impl):
    """Whatever a pad position holds, outputs at real positions are the same."""
    attn = make()
    x = torch.randn(1, 6, D)
    pad = torch.tensor([[False] * 4 + [True] * 2])
    y = x.clone()
    y[:, 4:] = torch.randn(1, 2, D) * 100
    a, _ = run(attn, x, impl, padding_mask=pad)
    b, _ = run(attn, y, impl, padding_mask=pad)
    torch.testing.assert_close(a[:, :4], b[:, :4])


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("causal", [False, True])
def test_fully_padded_sequence_gives_finite_zeros(impl, causal):
    """A row whose keys are all pads outputs finite values (zeros before the projection)."""
    attn = make(causal=causal, bias=False)
    pad = torch.ones(2, 5, dtype=torch.bool)
    pad[1, :2] = False
    out, _ = run(attn, torch.randn(2, 5, D), impl, padding_mask=pad)
    assert torch.isfinite(out).all()
    assert out[0].abs().max() == 0


def test_dropout_is_off_in_eval_mode_on_the_fast_path():
    """nanoGPT PR #240: SDPA got dropout_p in eval mode. Here eval mode is deterministic."""
    attn = make(dropout=0.5)
    x = torch.randn(2, 7, D)
    fast, _ = run(attn, x, "sdpa")
    ref, _ = run(attn, x, "reference")
    torch.testing.assert_close(fast, ref)
    attn.train()
    a, _ = run(attn, x, "sdpa")
    b, _ = run(attn, x, "sdpa")
    assert not torch.equal(a, b)


def test_qkv_is_one_fused_projection_with_optional_bias():
    assert make().qkv.weight.shape == (3 * D, D)
    assert make().qkv.bias is not None
    assert make(qkv_bias=False).qkv.bias is None


def test_matches_torch_multihead_attention_with_copied_weights():
    """Parity with nn.MultiheadAttention (same fused [q|k|v] layout), with a padding mask."""
    ours = make()
    ref = nn.MultiheadAttention(D, H, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(ours.qkv.weight)
        ref.in_proj_bias.copy_(ours.qkv.bias)
        ref.out_proj.weight.copy_(ours.proj.weight)
        ref.out_proj.bias.copy_(ours.proj.bias)
    x = torch.randn(2, 6, D)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    expected, w_ref = ref(x, x, x, key_padding_mask=pad, average_attn_weights=False)
    got, w = ours(x, padding_mask=pad, need_weights=True)
    assert (got - expected).abs().max() < 1e-5
    assert (w - w_ref).abs().max() < 1e-6


def test_kv_cache_step_by_step_equals_full_causal_attention():
    """Prefill 5 then decode 1 at a time: the outputs equal one full causal pass."""
    attn = make(causal=True)
    x = torch.randn(2, 9, D)
    full, _ = attn(x)
    cache = KVCache(2, H, 16, D // H)
    outs = [attn(x[:, :5], cache=cache)[0]]
    for t in range(5, 9):
        outs.append(attn(x[:, t : t + 1], cache=cache)[0])
    assert cache.pos == 9
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=0)


def test_kv_cache_multi_token_chunk_uses_an_offset_causal_mask():
    """A chunk of 3 after 4 cached tokens sees the cache and its own past only."""
    attn = make(causal=True)
    x = torch.randn(1, 7, D)
    full, _ = attn(x)
    cache = KVCache(1, H, 8, D // H)
    attn(x[:, :4], cache=cache)
    for impl in ("sdpa",):
        attn.impl = impl
        chunk, _ = attn(x[:, 4:], cache=cache)
    torch.testing.assert_close(chunk, full[:, 4:], atol=1e-5, rtol=0)


def test_kv_cache_misuse_is_a_clear_error():
    cache = KVCache(2, H, 4, D // H)
    with pytest.raises(LaminaError, match="larger than the KV cache"):
        cache.append(torch.zeros(3, H, 1, D // H), torch.zeros(3, H, 1, D // H))
    cache.append(torch.zeros(2, H, 4, D // H), torch.zeros(2, H, 4, D // H))
    with pytest.raises(LaminaError, match="full"):
        cache.append(torch.zeros(2, H, 1, D // H), torch.zeros(2, H, 1, D // H))
    cache.reset()
    assert cache.pos == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(d_model=30, n_heads=4), "not divisible"),
        (dict(d_model=32, n_heads=0), "n_heads"),
        (dict(d_model=32, n_heads=4, dropout=1.0), "dropout"),
        (dict(d_model=32, n_heads=4, impl="flash"), "impl"),
    ],
)
def test_bad_construction_raises_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)


@pytest.mark.parametrize(
    "mask, message",
    [
        (torch.zeros(2, 4, dtype=torch.bool), "shape"),
        (torch.zeros(2, 5, dtype=torch.long), "bool"),
    ],
)
def test_bad_padding_mask_raises_value_error(mask, message):
    with pytest.raises(ValueError, match=message):
        make()(torch.randn(2, 5, D), padding_mask=mask)

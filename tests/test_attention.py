"""Layer 2: multi-head self-attention (masks, weights, fast path = reference path, KV cache)."""

import pytest
import torch
from torch import nn

from lamina import native
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


# --- grouped-query attention, rotary positions, QK-norm ---------------------------------------

MODERN = [
    dict(n_kv_heads=1),
    dict(n_kv_heads=2),
    dict(rope_theta=10000.0),
    dict(qk_norm=True),
    dict(n_kv_heads=2, rope_theta=500.0, qk_norm=True, qkv_bias=False, bias=False),
]


@pytest.mark.parametrize("kw", MODERN)
@pytest.mark.parametrize("causal, with_mask", [(True, False), (True, True), (False, True)])
def test_fast_path_equals_reference_path_for_gqa_rope_and_qk_norm(kw, causal, with_mask):
    attn = make(causal=causal, **kw)
    x = torch.randn(3, 9, D)
    pad = None
    if with_mask:
        pad = torch.zeros(3, 9, dtype=torch.bool)
        pad[0, 6:] = True
        pad[1, :2] = True
    fast, _ = run(attn, x, "sdpa", padding_mask=pad)
    ref, w = run(attn, x, "reference", padding_mask=pad, need_weights=True)
    assert w.shape == (3, H, 9, 9)
    assert (fast - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("kw", MODERN)
def test_kv_cache_of_n_kv_heads_step_by_step_equals_full(kw):
    """The cache holds n_kv_heads heads of rotated keys; decoding continues the positions."""
    attn = make(causal=True, **kw)
    x = torch.randn(2, 9, D)
    full, _ = attn(x)
    cache = KVCache(2, attn.n_kv_heads, 16, D // H)
    outs = [attn(x[:, :5], cache=cache)[0]]
    for t in range(5, 9):
        outs.append(attn(x[:, t : t + 1], cache=cache)[0])
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=0)


def test_gqa_projection_is_one_fused_matmul_of_the_grouped_width():
    attn = make(n_kv_heads=2)
    hd = D // H
    assert tuple(attn.qkv.weight.shape) == ((H + 2 * 2) * hd, D)
    assert tuple(make(n_kv_heads=H).qkv.weight.shape) == (3 * D, D)


@pytest.mark.parametrize("n_kv", [1, 2])
def test_gqa_equals_mha_whose_kv_heads_are_repeated_copies(n_kv):
    """Query head h reads kv head h // (H / n_kv): copy those rows into a full MHA, same output."""
    gqa = make(causal=True, n_kv_heads=n_kv, rope_theta=10000.0)
    mha = make(causal=True, rope_theta=10000.0)
    hd, g = D // H, H // n_kv
    wq, wk, wv = gqa.qkv.weight.split([D, n_kv * hd, n_kv * hd])
    bq, bk, bv = gqa.qkv.bias.split([D, n_kv * hd, n_kv * hd])

    def repeat(t):  # (n_kv * hd, ...) -> (H * hd, ...), each kv head g times in a row
        return t.unflatten(0, (n_kv, hd)).repeat_interleave(g, dim=0).flatten(0, 1)

    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([wq, repeat(wk), repeat(wv)]))
        mha.qkv.bias.copy_(torch.cat([bq, repeat(bk), repeat(bv)]))
        mha.proj.load_state_dict(gqa.proj.state_dict())
    x = torch.randn(2, 7, D)
    torch.testing.assert_close(gqa(x)[0], mha(x)[0], atol=1e-6, rtol=0)


def test_rotary_scores_depend_only_on_the_offset_and_keep_norms():
    from lamina.attention import apply_rotary, rotary_tables

    hd = 16
    q, k = torch.randn(1, 1, 1, hd), torch.randn(1, 1, 1, hd)

    def score(i, j):
        cq, sq = rotary_tables(torch.tensor([i]), hd)
        ck, sk = rotary_tables(torch.tensor([j]), hd)
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum().item()

    for i, j, shift in [(3, 1, 5), (10, 10, 17), (0, 7, 40)]:
        assert abs(score(i, j) - score(i + shift, j + shift)) < 1e-5
    assert abs(score(3, 1) - score(1, 3)) > 1e-3  # direction matters: it is not a plain mask
    cos, sin = rotary_tables(torch.arange(50), hd)
    x = torch.randn(2, 3, 50, hd)
    torch.testing.assert_close(apply_rotary(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


def test_rope_explicit_tables_equal_default_positions():
    from lamina.attention import rotary_tables

    attn = make(causal=True, rope_theta=10000.0)
    x = torch.randn(2, 6, D)
    tables = rotary_tables(torch.arange(6), D // H, 10000.0)
    torch.testing.assert_close(attn(x, rope=tables)[0], attn(x)[0])
    shifted = rotary_tables(torch.arange(3, 9), D // H, 10000.0)
    assert (attn(x, rope=shifted)[0] - attn(x)[0]).abs().max() < 1e-5  # relative: same scores


def test_qk_norm_makes_attention_blind_to_the_scale_of_q_and_k():
    attn = make(causal=True, qk_norm=True, qkv_bias=False, eps=1e-12)  # eps would blur it
    x = torch.randn(2, 6, D)
    out, w = attn(x, need_weights=True)
    with torch.no_grad():
        attn.qkv.weight[: 2 * D] *= 7.0  # q and k rows scaled; v untouched
    out2, w2 = attn(x, need_weights=True)
    torch.testing.assert_close(w2, w, atol=1e-5, rtol=0)
    assert tuple(attn.q_gain.shape) == (D // H,)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_kv_heads=3), "n_heads=4 is not divisible by n_kv_heads=3"),
        (dict(n_kv_heads=0), "n_kv_heads must be a positive integer, got 0"),
        (dict(rope_theta=0.0), "rope_theta must be positive, got 0.0"),
        (dict(d_model=36, n_heads=4, rope_theta=1e4), "even head dimension, got 9"),
    ],
)
def test_bad_modern_construction_names_the_field_and_value(kwargs, message):
    kwargs = {"d_model": D, "n_heads": H, **kwargs}
    with pytest.raises(LaminaError, match=message):
        MultiHeadAttention(**kwargs)


B = 2
WINDOWED = dict(
    n_kv_heads=2, rope_theta=1e4, qk_norm=True, norm_offset=1.0, sliding_window=3, rotary_dim=4
)


@pytest.mark.parametrize("scale", [None, 0.7])
def test_sliding_window_fast_path_equals_reference_with_padding_and_a_cache(scale):
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, causal=True, scale=scale, **WINDOWED).eval()
    x = torch.randn(B, 9, D)
    pads = torch.zeros(B, 9, dtype=torch.bool)
    pads[1, :2] = True  # row 1 is left-padded
    outs = {}
    for impl in ("sdpa", "reference"):
        attn.impl = impl
        full, _ = attn(x, pads)
        cache = KVCache(B, 2, 9, D // H)
        steps = [attn(x[:, :4], pads[:, :4], cache=cache)[0]]
        steps += [attn(x[:, t : t + 1], pads[:, : t + 1], cache=cache)[0] for t in range(4, 9)]
        assert torch.allclose(torch.cat(steps, 1), full, atol=1e-6)
        outs[impl] = full
    assert torch.allclose(outs["sdpa"], outs["reference"], atol=1e-6)
    # a query sees only its last 3 keys: changing key 0 moves outputs 0..2 and no later one
    moved, _ = attn(torch.cat([torch.randn(B, 1, D), x[:, 1:]], 1), pads)
    changed = (moved - outs["reference"]).abs().amax((0, 2)) > 0
    assert changed.tolist() == [True, True, True] + [False] * 6


def test_soft_cap_bounds_the_scores_and_takes_the_written_out_path():
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, causal=True, softcap=0.1).eval()
    x = torch.randn(B, 5, D) * 10
    _, w = attn(x, need_weights=True)
    # scores within +-0.1 after the cap: no weight in a row of i+1 keys is far from 1/(i+1)
    last = w[..., 4, :]  # (B, H, 5): the row of the last query
    ratio = (last.amax(-1) / last.amin(-1)).max()
    assert ratio < torch.exp(torch.tensor(0.2)) + 1e-6
    attn.impl = "sdpa"  # the cap has no SDPA form: the same written-out result either way
    assert torch.equal(attn(x)[0], attn(x, need_weights=True)[0])


def test_bf16_training_on_a_cpu_runs_narrow_heads_attention_in_fp32():
    from lamina.cpu import UPCAST_HEAD_WIDTH, upcast_attention

    narrow = torch.randn(1, 2, 4, UPCAST_HEAD_WIDTH // 2, dtype=torch.bfloat16)
    assert not upcast_attention(narrow)  # no gradient recorded: the bf16 forward
    assert upcast_attention(narrow.requires_grad_())
    assert not upcast_attention(torch.randn(1, 2, 4, UPCAST_HEAD_WIDTH).requires_grad_())
    assert not upcast_attention(torch.randn(1, 2, 4, 8, requires_grad=True))  # fp32 already
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, causal=True).train()
    x = torch.randn(2, 6, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = attn(x)
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and x.grad is not None
    torch.testing.assert_close(out.float(), attn(x)[0], atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("kernel_name", ["sdpa", "native"])
def test_bf16_training_rotates_and_normalises_q_and_k_in_fp32_before_the_fp32_kernel(
    monkeypatch, kernel_name
):
    """Where the narrow-head kernel runs in fp32, q and k are cast once, before the qk-norm and
    the rotation, so they reach it without a round trip through bf16 (the cheaper order): torch's
    SDPA, or lamina.native's training attention (its q, k, v form) where that runs."""
    import lamina.attention as la

    seen = {}
    if kernel_name == "sdpa":
        kernel = la.F.scaled_dot_product_attention
        monkeypatch.setattr(la.train_attention, "causal_attention", lambda *a: None)
    else:
        kernel = la.train_attention.causal_attention
        if native.reason() is not None:
            pytest.skip(f"native library not available here: {native.reason()}")

    def spy(q, k, v, *args, **kw):
        seen["q"], seen["k"] = q.detach(), k.detach()
        return kernel(q, k, v, *args, **kw)

    if kernel_name == "sdpa":
        monkeypatch.setattr(la.F, "scaled_dot_product_attention", spy)
    else:
        monkeypatch.setattr(la.train_attention, "causal_attention", spy)
    torch.manual_seed(0)
    attn = la.MultiHeadAttention(32, 4, causal=True, rope_theta=10000.0, qk_norm=True).train()
    x = torch.randn(2, 6, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = attn(x)
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16 and x.grad is not None
    q = seen["q"]
    assert q.dtype == torch.float32
    assert not torch.equal(q, q.bfloat16().float())  # not rounded to bf16 after the rotation
    with torch.autocast("cpu", dtype=torch.bfloat16):
        qkv = attn.qkv(x.detach())  # the projection as bf16 computes it
    q0 = qkv[..., :32].float().view(2, 6, 4, 8).transpose(1, 2)
    q0 = la.rms_norm(q0, attn.q_gain, attn.eps, attn.norm_offset)
    want = la.apply_rotary(q0, *la.rotary_tables(torch.arange(6), 8, 10000.0))
    torch.testing.assert_close(q, want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.float(), attn(x)[0], atol=3e-2, rtol=3e-2)  # fp32 throughout


def test_plain_causal_fused_attention_builds_no_mask(monkeypatch):
    import lamina.attention as la

    torch.manual_seed(0)
    attn = la.MultiHeadAttention(16, 2, causal=True).eval()
    x = torch.randn(2, 5, 16)
    want, _ = attn(x, need_weights=True)  # the reference path builds and applies the mask

    def refuse(*a, **k):
        raise AssertionError("a mask was built for plain causal attention")

    monkeypatch.setattr(la, "attention_mask", refuse)
    got, _ = attn(x)  # the fused kernel's causal flag: no mask built
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(AssertionError, match="mask was built"):
        attn(x, padding_mask=torch.zeros(2, 5, dtype=torch.bool))  # a padded batch needs one

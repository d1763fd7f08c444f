"""A prompt's causal attention in lamina.native (decode.c lm_prefill_attention) against torch's
SDPA: GQA groups, head widths, odd lengths, a cache's offset, strided views, threads, both
vector forms; the models' prefills with and without it; and the cases that keep SDPA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import lamina.attention as attention
from lamina import GPT, GPTConfig, cpu
from lamina.attention import MultiHeadAttention
from lamina.native.prefill import causal_attention

TOL = {"rtol": 1e-4, "atol": 2e-5}  # the inputs' scores are large (tens): ~1e-6 of them apart


@pytest.fixture(scope="module")
def lib(native_lib):
    return native_lib


def _sdpa(q, k, v, scale):
    """torch's causal attention with queries the last T of Tk positions, as (B, T, H hd)."""
    B, H, T, hd = q.shape
    Tk = k.shape[2]
    mask = torch.ones(T, Tk, dtype=torch.bool).tril(Tk - T)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != H
    )
    return out.transpose(1, 2).reshape(B, T, H * hd)


def _qkv(B, H, Hkv, T, Tk, hd, seed=0):
    """q, k, v as a layer holds them: q a view of a fused projection's output (B, T, ...) and
    k, v the first Tk positions of a longer cache."""
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(B, T, (H + 2 * Hkv) * hd, generator=g)
    q = fused[..., : H * hd].view(B, T, H, hd).transpose(1, 2)
    cache = torch.randn(2, B, Hkv, Tk + 5, hd, generator=g) * 2
    return q * 2, cache[0, :, :, :Tk], cache[1, :, :, :Tk]


def _forms(lib):
    """The vector forms this CPU runs (1: AVX-512, 0: AVX2)."""
    before = lib.lm_patt_wide(-1)
    try:
        return [f for f in (1, 0) if lib.lm_patt_wide(f) == f]
    finally:
        lib.lm_patt_wide(before)


@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (8, 2)])  # GQA groups of 1, 3, 4
@pytest.mark.parametrize("hd", [32, 64, 128, 24])
@pytest.mark.parametrize("lengths", [(1, 1), (7, 7), (45, 45), (70, 70), (19, 52)])
def test_equals_sdpa(lib, heads, hd, lengths):
    H, Hkv = heads
    T, Tk = lengths
    q, k, v = _qkv(2, H, Hkv, T, Tk, hd)
    want = _sdpa(q, k, v, hd**-0.5)
    before = lib.lm_patt_wide(-1)
    try:
        for form in _forms(lib):
            lib.lm_patt_wide(form)
            got = causal_attention(q, k, v, hd**-0.5)
            assert got is not None and got.shape == want.shape
            torch.testing.assert_close(got, want, **TOL)
    finally:
        lib.lm_patt_wide(before)


def test_threads_change_no_bit(lib):
    q, k, v = _qkv(2, 9, 3, 83, 83, 64, seed=1)
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append(causal_attention(q, k, v, 0.125))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(o, outs[0]) for o in outs)
    torch.testing.assert_close(outs[0], _sdpa(q, k, v, 0.125), **TOL)


def test_shapes_it_does_not_take_return_none(lib):
    q, k, v = _qkv(1, 4, 2, 9, 9, 20)  # heads 20 wide: not a multiple of 8
    assert causal_attention(q, k, v, 0.2) is None
    q, k, v = _qkv(1, 4, 2, 9, 9, 264)  # wider than 256
    assert causal_attention(q, k, v, 0.1) is None
    q, k, v = _qkv(1, 4, 2, 9, 9, 32)
    assert causal_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.2) is None
    assert causal_attention(q, k[:, :, :5], v[:, :, :5], 0.2) is None  # fewer keys than queries
    with cpu.using("torch"):  # a PyTorch-only kernel policy
        assert causal_attention(q, k, v, 0.2) is None
    q.requires_grad_(True)
    assert causal_attention(q, k, v, 0.2) is None
    with torch.no_grad():
        assert causal_attention(q, k, v, 0.2) is not None


class _Spy:
    """Counts lamina.attention's calls of the native kernel and what they gave; `off` makes it
    give None (SDPA runs)."""

    def __init__(self, off: bool = False) -> None:
        self.calls, self.taken, self.off = 0, 0, off

    def __call__(self, q, k, v, scale):
        self.calls += 1
        if self.off:
            return None
        out = causal_attention(q, k, v, scale)
        self.taken += out is not None
        return out


def _layer(**kw) -> MultiHeadAttention:
    torch.manual_seed(0)
    kw = {"causal": True, "n_kv_heads": 2, "rope_theta": 10000.0, **kw}
    return MultiHeadAttention(48, 6, **kw).eval()


def test_a_layer_takes_it_for_a_prompt_and_equals_sdpa(lib, monkeypatch):
    layer = _layer()
    x = torch.randn(2, 33, 48)
    spy = _Spy()
    monkeypatch.setattr(attention, "causal_attention", spy)
    with torch.no_grad():
        got, _ = layer(x)
        cache = attention.KVCache(2, 2, 64, 8)
        first, _ = layer(x[:, :20], cache=cache)
        rest, _ = layer(x[:, 20:], cache=cache)  # queries after a cache's first 20 positions
    assert (spy.calls, spy.taken) == (3, 3)
    monkeypatch.setattr(attention, "causal_attention", _Spy(off=True))
    with torch.no_grad():
        want, _ = layer(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.cat([first, rest], 1), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "case", ["grad", "padding", "window", "dropout", "one token", "not causal", "weights"]
)
def test_other_cases_keep_sdpa(lib, monkeypatch, case):
    layer = _layer(
        sliding_window=8 if case == "window" else None,
        dropout=0.1 if case == "dropout" else 0.0,
        causal=case != "not causal",
    )
    x = torch.randn(1, 1 if case == "one token" else 21, 48)
    spy = _Spy()
    monkeypatch.setattr(attention, "causal_attention", spy)
    pads = torch.zeros(1, 21, dtype=torch.bool) if case == "padding" else None
    if case == "dropout":
        layer.train()
    if case == "grad":
        layer(x.requires_grad_(True))[0].sum().backward()
    else:
        with torch.no_grad():
            layer(x, padding_mask=pads, need_weights=case == "weights")
    assert spy.taken == 0


def test_a_models_prefill_logits_hold_with_and_without_it(lib, monkeypatch):
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=97, block_size=96, d_model=128, n_heads=6, n_layers=2, d_ff=192,
        positions="rope", norm="rms", activation="swiglu", n_kv_heads=2, d_head=64, bias=False,
    )  # fmt: skip
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)  # larger weights than the init's, so errors show
    ids = torch.randint(0, 97, (2, 77), generator=torch.Generator().manual_seed(2))
    spy = _Spy()
    monkeypatch.setattr(attention, "causal_attention", spy)
    with torch.no_grad():
        got = model(ids)
    assert spy.taken == cfg.n_layers
    monkeypatch.setattr(attention, "causal_attention", _Spy(off=True))
    with torch.no_grad():
        want = model(ids)
    assert ((got - want).norm() / want.norm()).item() < 1e-6
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_the_real_models_prompt_logits_hold(lib, monkeypatch, smollm2_gguf):
    from lamina.interop.gguf import load_gguf

    model, _ = load_gguf(smollm2_gguf)
    model.eval()
    ids = torch.randint(0, 49152, (1, 61), generator=torch.Generator().manual_seed(4))
    spy = _Spy()
    monkeypatch.setattr(attention, "causal_attention", spy)
    with torch.no_grad():
        got = model(ids)
    assert spy.taken == model.config.n_layers
    monkeypatch.setattr(attention, "causal_attention", _Spy(off=True))
    with torch.no_grad():
        want = model(ids)
    assert ((got - want).norm() / want.norm()).item() < 1e-5
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_a_compiled_graph_keeps_sdpa(lib):
    layer = _layer()
    x = torch.randn(1, 20, 48)
    # dynamo alone (no inductor build): a ctypes call in the traced graph would break it
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x)[0], layer(x)[0], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the bf16 form (issue 31)
# decode.c's lm_patt_bf16: a prompt's chunks in the native runtime attend with both products
# in bf16 (`vdpbf16ps`, float sums); lm_prefill_attention_bf16 runs that form on given q, k, v.

LOG2E = 1.4426950408889634


def _bf16_on(lib) -> None:
    if not lib.lm_patt_bf16(-1):
        pytest.skip("no AVX-512 BF16 on this CPU (or the form is switched off)")


def _bf16_attention(lib, q, k, v, scale, threads=1):
    B, H, T, hd = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    out = torch.empty(B, T, H * hd)
    strides = torch.tensor([*q.stride()[:3], *k.stride()[:3], *v.stride()[:3]], dtype=torch.int64)
    ok = lib.lm_prefill_attention_bf16(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
        B, H, Hkv, T, Tk, hd, float(scale), strides.data_ptr(), threads,
    )  # fmt: skip
    return out if ok else None


def _bf16_model(q, k, v, scale, block=32):
    """The bf16 form's arithmetic in float64: queries (prescaled, in base 2), keys and values
    rounded to bf16; the softmax online over blocks of 32 keys in base 2, each block's weights
    rounded to bf16 before they are summed and multiplied by the values."""
    B, H, T, hd = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = H // Hkv

    def bf(t):
        return t.float().bfloat16().double()

    qb = bf(q * (scale * LOG2E))
    kb, vb = bf(k).repeat_interleave(G, 1), bf(v).repeat_interleave(G, 1)
    s = qb @ kb.transpose(-1, -2)
    hidden = torch.arange(Tk)[None] > torch.arange(T)[:, None] + Tk - T
    s = s.masked_fill(hidden, float("-inf"))
    m = torch.full((B, H, T, 1), float("-inf"), dtype=torch.float64)
    den = torch.zeros(B, H, T, 1, dtype=torch.float64)
    o = torch.zeros(B, H, T, hd, dtype=torch.float64)
    for j in range(0, Tk, block):
        sb = s[..., j : j + block]
        new = torch.maximum(m, sb.amax(-1, keepdim=True))
        al = torch.where(m == float("-inf"), 0.0, (m - new).exp2())
        p = torch.where(sb == float("-inf"), 0.0, bf((sb - new).exp2()))
        den, o, m = den * al + p.sum(-1, keepdim=True), o * al + p @ vb[..., j : j + block, :], new
    return (o / den).float().transpose(1, 2).reshape(B, T, H * hd)


@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (9, 3)])  # GQA groups of 1, 3 (SmolLM2's), 3
@pytest.mark.parametrize(
    "hd", [16, 48, 64, 80, 128]
)  # 64: SmolLM2's; 48, 80: a pass of 64 and less
@pytest.mark.parametrize("lengths", [(7, 7), (45, 45), (70, 70), (19, 52), (33, 100)])
def test_bf16_form_equals_its_model_and_float_within_its_rounding(lib, heads, hd, lengths):
    _bf16_on(lib)
    H, Hkv = heads
    T, Tk = lengths  # T < Tk: a chunk after cached keys
    q, k, v = _qkv(2, H, Hkv, T, Tk, hd, seed=hd + T)
    got = _bf16_attention(lib, q, k, v, hd**-0.5)
    assert got is not None
    # the float sums' order differs from the model's, and where the kernel's 2^x (rel. ~2e-6)
    # and the model's fall on either side of a bf16 rounding boundary a weight moves by 2^-8
    # of itself (in ~0.1% of the weights: these scores are tens, their float sums' error ~1e-5
    # of a weight): an output by 2^-8 of the largest value at most, all of them by 1e-5 to 3e-4
    # (~5e-3 from float, below)
    want = _bf16_model(q, k, v, hd**-0.5)
    assert (got - want).abs().max().item() < 2**-8 * v.abs().max().item()
    assert ((got - want).norm() / want.norm()).item() < 5e-4
    # bf16's 8 bits against float: ~5e-3 of the outputs on these scores (tens)
    ref = _sdpa(q, k, v, hd**-0.5)
    assert ((got - ref).norm() / ref.norm()).item() < 1.5e-2


def test_bf16_form_threads_change_no_bit_and_switch(lib):
    _bf16_on(lib)
    q, k, v = _qkv(2, 9, 3, 83, 120, 64, seed=1)
    one, two = (_bf16_attention(lib, q, k, v, 0.125, n) for n in (1, 2))
    assert torch.equal(one, two)
    assert not torch.equal(one, causal_attention(q, k, v, 0.125))  # a form of its own
    q24, k24, v24 = _qkv(1, 4, 2, 9, 9, 24)
    assert _bf16_attention(lib, q24, k24, v24, 0.2) is None  # hd not a multiple of 16
    try:
        assert lib.lm_patt_bf16(0) == 0
        assert _bf16_attention(lib, q, k, v, 0.125) is None  # switched off
    finally:
        lib.lm_patt_bf16(1)


def test_the_real_models_runtime_keeps_its_tokens_with_the_bf16_form(lib, smollm2_gguf):
    """A prompt in two chunks (the second after cached keys) through the runtime's run path:
    16 greedy tokens the same with the attention in bf16 and in float; the switch off gives
    the float form's bits however often it is turned."""
    from lamina.native.runtime import Runtime

    _bf16_on(lib)
    rt = Runtime.open(smollm2_gguf, cache_len=256, threads=2)
    text = (
        "The river runs past the old mill, where the miller keeps his stones and his accounts. "
        "Every spring the water rises, and the villagers gather on the bridge to watch it. "
        "They tell stories of the great flood, when the mill wheel turned so fast that the "
        "miller's son was carried off to the sea and came back years later as a captain. "
        "Now the captain is old too, and he sits by the window of the inn and tells the "
        "children how the sea looks in winter, grey and wide and cold. When they ask him"
    )
    ids = rt.tokenizer.encode(text)
    assert len(ids) > 2 * 16

    def run(form):
        lib.lm_patt_bf16(form)
        rt.forget(0)
        rt.feed(ids[:40])  # the first chunk; generate feeds the rest after it
        return list(rt.generate(ids, 16)), rt._call(ids[:20], 0, keep=19).copy()

    try:
        off, lg_off = run(0)
        on, lg_on = run(1)
        off2, lg_off2 = run(0)
    finally:
        lib.lm_patt_bf16(1)
    assert on == off == off2
    assert np.array_equal(lg_off, lg_off2) and not np.array_equal(lg_on, lg_off)
    assert np.abs(lg_on - lg_off).max() < 0.05 * np.abs(lg_off).max()

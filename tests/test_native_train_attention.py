"""A training step's causal attention in lamina.native (decode.c lm_train_attention_fwd/_bwd)
against torch's SDPA: outputs and the three gradients, fp32 and bf16, GQA groups, head widths,
odd lengths, both call forms (the fused projection whole, or q, k, v views), threads, both
vector forms; a layer's and a model's training with and without it; the cases that keep SDPA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lamina import GPT, GPTConfig, cpu
from lamina.attention import KVCache, MultiHeadAttention
from lamina.native import train_attention as ta

# fp32: the inputs' scores are a few units, ~1e-6 apart; bf16: one rounding of the outputs
TOL = {
    torch.float32: {"rtol": 1e-4, "atol": 2e-5},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
}


@pytest.fixture(scope="module")
def lib(native_lib):
    return native_lib


def _views(qkv, H, Hkv, hd):
    B, T, _ = qkv.shape
    q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
    return (
        q.view(B, T, H, hd).transpose(1, 2),
        k.view(B, T, Hkv, hd).transpose(1, 2),
        v.view(B, T, Hkv, hd).transpose(1, 2),
    )


def _sdpa(qkv, H, Hkv, hd, scale):
    """torch's causal attention in fp32 on the fused rows, as (B, T, H hd)."""
    B, T, _ = qkv.shape
    q, k, v = (t.float() for t in _views(qkv, H, Hkv, hd))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=H != Hkv)
    return out.transpose(1, 2).reshape(B, T, H * hd)


def _forms(lib):
    """The vector forms this CPU runs (1: AVX-512, 0: AVX2)."""
    before = lib.lm_tatt_wide(-1)
    try:
        return [f for f in (1, 0) if lib.lm_tatt_wide(f) == f]
    finally:
        lib.lm_tatt_wide(before)


def _native(qkv, H, Hkv, hd, scale, packed):
    if packed:
        return ta.packed_causal_attention(qkv, H, Hkv, hd, scale)
    return ta.causal_attention(*_views(qkv, H, Hkv, hd), scale)


def _check(lib, B, H, Hkv, T, hd, dtype, packed, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = (torch.randn(B, T, (H + 2 * Hkv) * hd, generator=g) * 1.5).to(dtype)
    grad_out = torch.randn(B, T, H * hd, generator=g)
    ref = rows.float().clone().requires_grad_(True)
    want = _sdpa(ref, H, Hkv, hd, hd**-0.5)
    want.backward(grad_out)
    before = lib.lm_tatt_wide(-1)
    try:
        for form in _forms(lib):
            lib.lm_tatt_wide(form)
            x = rows.clone().requires_grad_(True)
            got = _native(x, H, Hkv, hd, hd**-0.5, packed)
            assert got is not None and got.shape == want.shape and got.dtype == dtype
            got.backward(grad_out.to(dtype))
            torch.testing.assert_close(got.float(), want.detach(), **TOL[dtype])
            assert x.grad.dtype == dtype
            torch.testing.assert_close(x.grad.float(), ref.grad, **TOL[dtype])
    finally:
        lib.lm_tatt_wide(before)


@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (3, 1)])  # GQA groups of 1, 3, 3
@pytest.mark.parametrize("hd", [32, 8, 24, 64])
@pytest.mark.parametrize("T", [64, 1, 13, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_sdpa(lib, heads, hd, T, dtype):
    _check(lib, 2, *heads, T, hd, dtype, packed=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 4, 2, 37, 32), (1, 2, 2, 256, 128), (1, 1, 1, 200, 16)])
def test_the_views_form_and_long_rows_equal_sdpa(lib, dtype, shape):
    _check(lib, *shape, dtype, packed=False, seed=1)
    if shape[3] == 256:
        _check(lib, *shape, dtype, packed=True, seed=2)


@pytest.mark.filterwarnings("ignore:Input #0 requires gradient")
def test_gradcheck_in_float64_terms(lib):
    """The fp32 gradients against torch.autograd's numerical ones at a tiny shape (float32
    differences: loose tolerances, but a wrong term is off by far more)."""
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(1, 5, 3 * 2 * 8, generator=g, requires_grad=True)
    fn = lambda r: ta.packed_causal_attention(r, 2, 2, 8, 0.35)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (rows,), eps=1e-2, atol=2e-3, rtol=2e-2)


def test_threads_change_no_bit(lib):
    g = torch.Generator().manual_seed(4)
    rows = torch.randn(3, 45, (6 + 4) * 32, generator=g).bfloat16()
    grad_out = torch.randn(3, 45, 6 * 32, generator=g).bfloat16()
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            x = rows.clone().requires_grad_(True)
            out = ta.packed_causal_attention(x, 6, 2, 32, 0.2)
            out.backward(grad_out)
            results.append((out, x.grad))
    finally:
        torch.set_num_threads(threads)
    for out, grad in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(grad, results[0][1])


def test_what_it_does_not_take_returns_none(lib):
    def rows(hd, T=9, dtype=torch.float32, grad=True):
        return torch.randn(1, T, 3 * 2 * hd, dtype=dtype, requires_grad=grad)

    assert ta.packed_causal_attention(rows(20), 2, 2, 20, 0.2) is None  # not a multiple of 8
    assert ta.packed_causal_attention(rows(136), 2, 2, 136, 0.2) is None  # wider than 128
    assert ta.packed_causal_attention(rows(16, T=257), 2, 2, 16, 0.2) is None  # longer than 256
    assert ta.packed_causal_attention(rows(16, dtype=torch.float16), 2, 2, 16, 0.2) is None
    assert ta.packed_causal_attention(rows(16, grad=False), 2, 2, 16, 0.2) is None
    assert ta.packed_causal_attention(rows(16), 2, 2, 8, 0.2) is None  # widths disagree
    q, k, v = _views(rows(16), 2, 2, 16)
    assert ta.causal_attention(q, k.bfloat16(), v, 0.2) is None  # dtypes differ
    with torch.no_grad():
        assert ta.packed_causal_attention(rows(16), 2, 2, 16, 0.2) is None
    with cpu.using("torch"):  # a PyTorch-only kernel policy
        assert ta.packed_causal_attention(rows(16), 2, 2, 16, 0.2) is None
    assert ta.packed_causal_attention(rows(16), 2, 2, 16, 0.2) is not None


class _Spy:
    """Counts lamina.attention's calls of one of the kernel's forms and what they gave; `off`
    makes it give None (SDPA runs)."""

    def __init__(self, fn, off: bool = False) -> None:
        self.fn, self.calls, self.taken, self.off = fn, 0, 0, off

    def __call__(self, *args):
        self.calls += 1
        if self.off:
            return None
        out = self.fn(*args)
        self.taken += out is not None
        return out


def _spies(monkeypatch, off=False):
    packed = _Spy(ta.packed_causal_attention, off)
    views = _Spy(ta.causal_attention, off)
    monkeypatch.setattr(ta, "packed_causal_attention", packed)
    monkeypatch.setattr(ta, "causal_attention", views)
    return packed, views


def _layer_grads(layer, x, autocast):
    layer.zero_grad()
    x = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, _ = layer(x)
    out.float().pow(2).sum().backward()
    return [out.float(), x.grad, *(p.grad for p in layer.parameters())]


@pytest.mark.parametrize("kind", ["packed", "rope", "qk-norm gqa"])
@pytest.mark.parametrize("autocast", [False, True])
def test_a_layer_trains_with_it_as_with_sdpa(lib, monkeypatch, kind, autocast):
    torch.manual_seed(0)
    kw = {"rope_theta": 10000.0} if kind == "rope" else {}
    if kind == "qk-norm gqa":
        kw = {"qk_norm": True, "n_kv_heads": 2, "rope_theta": 10000.0}
    layer = MultiHeadAttention(64, 4, causal=True, **kw).train()
    x = torch.randn(3, 29, 64)
    packed, views = _spies(monkeypatch)
    got = _layer_grads(layer, x, autocast)
    assert (packed.taken, views.taken) == ((1, 0) if kind == "packed" else (0, 1))
    _spies(monkeypatch, off=True)
    want = _layer_grads(layer, x, autocast)
    tol = TOL[torch.bfloat16 if autocast else torch.float32]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize(
    "case", ["no grad", "padding", "window", "dropout", "cache", "not causal", "weights"]
)
def test_other_cases_keep_sdpa(lib, monkeypatch, case):
    torch.manual_seed(0)
    layer = MultiHeadAttention(
        64, 4, causal=case != "not causal", dropout=0.1 if case == "dropout" else 0.0,
        sliding_window=8 if case == "window" else None,
    ).train()  # fmt: skip
    x = torch.randn(1, 21, 64, requires_grad=True)
    packed, views = _spies(monkeypatch)
    pads = torch.zeros(1, 21, dtype=torch.bool) if case == "padding" else None
    cache = KVCache(1, 4, 32, 16)
    with torch.set_grad_enabled(case != "no grad"):
        layer(
            x, padding_mask=pads, need_weights=case == "weights",
            cache=cache if case == "cache" else None,
        )  # fmt: skip
    assert packed.calls + views.calls == 0 or packed.taken + views.taken == 0


def test_a_models_training_losses_hold_with_and_without_it(lib, monkeypatch):
    """Ten AdamW steps of a small GPT under bf16 autocast, native against SDPA: the same
    losses to within bf16's drift."""
    cfg = GPTConfig(vocab_size=65, block_size=32, d_model=64, n_heads=4, n_layers=2, dropout=0.0)
    ids = torch.randint(0, 65, (4, 33), generator=torch.Generator().manual_seed(5))

    def losses(off):
        packed, _ = _spies(monkeypatch, off=off)
        torch.manual_seed(0)
        model = GPT(cfg).train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        out = []
        for _ in range(10):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, 65), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        return out, packed.taken

    got, taken = losses(off=False)
    want, _ = losses(off=True)
    assert taken == 10 * cfg.n_layers
    assert got[-1] < got[0] - 0.3  # it learns
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 0.02


def test_a_compiled_graph_keeps_sdpa(lib):
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 2, causal=True).train()
    x = torch.randn(1, 12, 32, requires_grad=True)
    torch._dynamo.reset()  # static shapes, whatever compiled the layer's forward before
    # dynamo alone (no inductor build): a ctypes call in the traced graph would break it
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    try:
        torch.testing.assert_close(compiled(x)[0], layer(x)[0], rtol=1e-5, atol=1e-6)
    finally:  # a second compile of the layer's forward elsewhere starts afresh (static shapes)
        torch._dynamo.reset()

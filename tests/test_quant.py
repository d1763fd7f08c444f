"""Weight-only quantization: error bounds, kernel = reference path, tying, bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import lamina
from lamina import GPT, GPTConfig, LaminaError, cpu, quant
from lamina.native.build import library
from lamina.quant import Int4Linear, Int8Linear, quantize, quantize_int4, quantize_int8


def _model(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=97, block_size=32, d_model=64, n_heads=4, n_layers=2, **kw)
    return GPT(cfg).eval()


def test_int8_rows_round_to_within_half_a_step():
    w = torch.randn(40, 64) * torch.linspace(0.01, 3, 40)[:, None]
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and s.shape == (40,)
    err = (q.float() * s[:, None] - w).abs()
    assert bool((err <= s[:, None] / 2 + 1e-6).all())
    assert int(q.abs().max()) == 127  # each row's largest weight uses the full range


def test_int4_groups_round_to_within_half_a_step():
    w = torch.randn(24, 128)
    packed, sz = quantize_int4(w, 32)
    assert packed.shape == (24, 64) and packed.dtype == torch.uint8 and sz.shape == (4, 24, 2)
    lin = nn.Linear(128, 24, bias=False)
    lin.weight.data.copy_(w)
    m = Int4Linear.from_linear(lin, 32)
    err = (m.dequantized() - w).abs().reshape(24, 4, 32)
    step = sz[..., 0].T  # (24, 4)
    assert bool((err <= step[..., None] / 2 + 1e-5).all())


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_kernel_path_equals_dequantized_path(kind):
    if cpu.layer_kernel() == "dequantize":
        pytest.skip("this CPU runs only the dequantized path")
    lin = nn.Linear(128, 40)  # 40 rows: int4 pads them to 48 for the kernel
    m = Int8Linear.from_linear(lin) if kind == "int8" else Int4Linear.from_linear(lin, 64)
    x = torch.randn(3, 5, 128)
    fast = m(x)
    with cpu.using("dequantize"):
        slow = m(x)
    assert fast.shape == slow.shape == (3, 5, 40) and fast.dtype == torch.float32
    # torch's packed kernels round activations to bf16, the native ones to int16 per 32
    tol = 2e-4 if cpu.layer_kernel() == "native" else 2e-2
    assert torch.allclose(fast, slow, rtol=tol, atol=tol * slow.abs().max().item())


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_long_call_multiplies_dequantized_in_the_dtype_lamina_cpu_picks(kind):
    """A call of more than MAX_ROWS rows on a layer prepared for the native kernel (a prefill):
    the weights dequantized in lamina.cpu.dequantized_dtype (bf16 where native), the output
    float32; with "dequantize" chosen, the float32 matmul itself."""
    lin = nn.Linear(128, 40)
    m = Int8Linear.from_linear(lin) if kind == "int8" else Int4Linear.from_linear(lin, 64)
    m.prepare("native")
    x = torch.randn(cpu.MAX_ROWS + 8, 128)
    with torch.no_grad():
        dtype = cpu.dequantized_dtype(x)
        want = (x.to(dtype) @ m.dequantized(dtype).T).float() + m.bias
        torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-5)
        with cpu.using("dequantize"):
            torch.testing.assert_close(m(x), x @ m.dequantized().T + m.bias)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("scheme,tol", [("int8", 0.03), ("int4", 0.3)])
def test_quantized_logits_stay_close(scheme, tol, tie):
    model = _model(tie_weights=tie)
    ids = torch.randint(0, 97, (2, 12))
    ref = model(ids)
    q = quantize(copy.deepcopy(model), scheme, group_size=32)
    out = q(ids)
    rel = ((out - ref).norm() / ref.norm()).item()
    assert rel < tol, f"{scheme}: relative logit error {rel:.3f}"
    assert not any(isinstance(m, nn.Linear) for m in q.blocks.modules())
    assert lamina.quant.scheme_of(q)["scheme"] == scheme


def test_tied_int8_head_and_table_are_one_tensor_and_lookups_are_its_rows():
    q = quantize(_model(), "int8")
    assert q.head.qweight.data_ptr() == q.embed.wte.qweight.data_ptr()
    ids = torch.tensor([[3, 5, 96]])
    rows = q.head.dequantized()[ids[0]]
    assert torch.equal(q.embed.wte(ids)[0], rows)
    names = set(quant.quantized_tensors(q))
    assert "embed.wte.qweight" in names and "head.qweight" not in names


def test_untied_int8_keeps_the_token_table_exact():
    model = _model(tie_weights=False)
    table = model.embed.wte.weight.detach().clone()
    q = quantize(model, "int8")
    assert isinstance(q.embed.wte, nn.Embedding) and torch.equal(q.embed.wte.weight, table)


def test_bad_input_is_refused():
    with pytest.raises(LaminaError, match="unknown quantization scheme 'int3'"):
        quantize(_model(), "int3")
    with pytest.raises(LaminaError, match="group_size must be one of"):
        quantize(_model(), "int4", group_size=48)
    with pytest.raises(LaminaError, match="does not divide the input width 64"):
        quantize(_model(), "int4", group_size=128)
    q = quantize(_model(), "int8")
    with pytest.raises(LaminaError, match="already quantized"):
        quantize(q, "int8")
    with pytest.raises(LaminaError, match="needs a lamina GPT"):
        quantize(nn.Linear(2, 2), "int8")  # type: ignore[arg-type]


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_saved_and_loaded_without_float_weights(tmp_path, scheme, tie):
    q = quantize(_model(tie_weights=tie), scheme, group_size=32)
    ids = torch.randint(0, 97, (2, 10))
    lamina.save(tmp_path / "q", q)
    back, _ = lamina.load(tmp_path / "q")
    assert quant.scheme_of(back) == quant.scheme_of(q)
    assert torch.equal(back(ids), q(ids))
    if tie and scheme == "int8":
        assert back.head.qweight.data_ptr() == back.embed.wte.qweight.data_ptr()
    assert not any(t.is_meta for t in [*back.parameters(), *back.buffers()])


def test_int8_file_is_about_a_quarter_of_fp32(tmp_path):
    model = _model(tie_weights=False)
    lamina.save(tmp_path / "f", model)
    lamina.save(tmp_path / "q", quantize(model, "int8"))
    full = (tmp_path / "f" / "model.safetensors").stat().st_size
    small = (tmp_path / "q" / "model.safetensors").stat().st_size
    # the untied token table (97 x 64) stays fp32; everything else is 1 byte per weight
    assert small < 0.45 * full


def test_a_quantized_file_with_missing_or_misshapen_scales_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    lamina.save(tmp_path / "q", quantize(_model(), "int8"))
    path = tmp_path / "q" / "model.safetensors"
    state = load_file(path)
    state["blocks.0.attn.qkv.scale"] = torch.ones(5)
    save_file(state, path)
    with pytest.raises(LaminaError, match="blocks.0.attn.qkv.scale has shape"):
        lamina.load(tmp_path / "q")
    del state["blocks.0.attn.qkv.scale"]
    save_file(state, path)
    with pytest.raises(LaminaError, match="missing keys: blocks.0.attn.qkv.scale"):
        lamina.load(tmp_path / "q")


@pytest.fixture(scope="module")
def trained():
    """A small character model trained for 200 steps on 60k characters of the built-in corpus."""
    from lamina.data.builtin import builtin_corpus

    text = builtin_corpus()[:60_000]
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=len(chars), block_size=64, d_model=64, n_heads=4, n_layers=2)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    split = int(0.9 * len(data))
    for _ in range(200):
        starts = torch.randint(0, split - 65, (16,))
        x = torch.stack([data[s : s + 64] for s in starts])
        y = torch.stack([data[s + 1 : s + 65] for s in starts])
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    val = data[split:]
    n = (len(val) - 1) // 64
    vx, vy = val[: n * 64].reshape(n, 64), val[1 : n * 64 + 1].reshape(n, 64)
    return model.eval(), vx, vy


def _loss(model, x, y) -> float:
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()


def test_int8_costs_under_1_percent_of_loss_and_keeps_greedy_tokens(trained):
    model, x, y = trained
    base = _loss(model, x, y)
    assert base < 3.0  # it learned something: chance is ln(vocab) ~ 4.4
    q8 = quantize(copy.deepcopy(model), "int8")
    assert abs(_loss(q8, x, y) - base) / base < 0.01
    prompt = x[:1, :8]
    assert torch.equal(q8.greedy(prompt, 20), model.greedy(prompt, 20))


def test_int4_costs_under_5_percent_of_loss(trained):
    model, x, y = trained
    base = _loss(model, x, y)
    q4 = quantize(copy.deepcopy(model), "int4", group_size=32)
    assert abs(_loss(q4, x, y) - base) / base < 0.05


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {
            "positions": "rope",
            "norm": "rms",
            "activation": "swiglu",
            "n_kv_heads": 2,
            "bias": False,
        },
        {"qk_norm": True, "activation": "relu2", "tie_weights": False},
    ],
)
def test_cached_generation_equals_uncached_for_every_option(scheme, options):
    q = quantize(_model(**options), scheme, group_size=32)
    prompts = [[5, 6, 7, 8], [9, 10]]
    with cpu.using("torch"):  # PyTorch's cached step (the native one: tests/test_native.py)
        cached = lamina.generate(q, prompts, 12)
        # the same layer kernel for both (a model the native step covers keeps its layers on
        # the native kernel, which "torch" runs dequantized)
        uncached = lamina.generate(q, prompts, 12, use_cache=False)
    assert torch.equal(cached, uncached)
    steps = list(lamina.stream(q, torch.tensor([[1, 2, 3]]), 6))
    assert len(steps) == 6


@pytest.mark.parametrize("in_features,group_size", [(96, 96), (128, 48), (96, 64), (128, 0)])
def test_int4_refuses_a_group_size_its_kernels_do_not_take(in_features, group_size):
    with pytest.raises(LaminaError, match="int4 group_size must be one of 32, 64, 128, 256"):
        Int4Linear(in_features, 8, False, group_size)


@pytest.mark.skipif(library() is None, reason="lamina.native not built here")
@pytest.mark.parametrize("group_size", [None, 32, 64])
def test_int8_prefill_weights_are_torch_bf16_dequantization(group_size):
    # a prefill's long call: the native dequantizer writes W in bf16 into a reused buffer; each
    # value must be `_dequantize_int8`'s in bf16 (the scale's bf16 times q, rounded once)
    from lamina.quant.bf16 import int8_bf16
    from lamina.quant.linear import _dequantize_int8

    g = torch.Generator().manual_seed(0)
    m = Int8Linear.from_linear(nn.Linear(128, 48))
    if group_size is not None:
        m = Int8Linear(128, 48, True, group_size=group_size)
        m.bias.data.copy_(torch.randn(48, generator=g))
        m.qweight.copy_(torch.randint(-127, 128, (48, 128), generator=g, dtype=torch.int8))
        m.scale.copy_(torch.rand(48, 128 // group_size, generator=g) * 0.01 + 1e-4)
    m.prepare("native")
    want = _dequantize_int8(m.qweight, m.scale, m.group_size, torch.bfloat16)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            got = int8_bf16(m)
            assert got is not None and torch.equal(got, want), threads
    finally:
        torch.set_num_threads(before)
    x = torch.randn(40, 128, generator=g)  # past 32 rows: dequantized, in bf16 where native
    if cpu.dequantized_dtype(x) == torch.bfloat16:
        expect = (x.bfloat16() @ want.T).float() + m.bias
        torch.testing.assert_close(m(x), expect, atol=0, rtol=0)

"""A prefill's linears in int8 x int8 (lamina.quant.int8mm, decode.c "a prefill's linears in
int8"): the natively made int8 weights and inputs equal torch's rounding of the same floats,
the product stays near the float one, and the switch and the policy (lamina.cpu.prefill_int8)
keep every other call on its own path."""

from __future__ import annotations

import pytest
import torch
from test_kquant import _rows

import lamina.cpu as cpu
from lamina import LaminaError, native
from lamina.frozen_linear import kept_dequantization
from lamina.native.build import library
from lamina.quant import Int4Linear, Int8Linear, int8mm
from lamina.quant.bf16 import dequantized_matmul
from lamina.quant.int8mm import (
    FLOOR,
    OUTLIERS,
    ROW_OUTLIERS,
    SMOOTH,
    int8_matmul,
    int8_weights,
    mark_roles,
)
from lamina.quant.kquant import BlockLinear
from lamina.quant.linear import quantize_int8

pytestmark = pytest.mark.skipif(
    native.reason() is not None or not native.available(), reason="lamina.native not built here"
)


def _linears(k: int = 96, n: int = 40) -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    dense = torch.nn.Linear(k, n, bias=False)
    grouped = Int8Linear.from_linear(dense)  # per row, then regrouped by 32 below
    grouped.qweight, grouped.scale = grouped.qweight, grouped.scale[:, None].repeat(1, k // 32)
    grouped.scale = grouped.scale * torch.rand(n, k // 32).add(0.5)  # distinct groups
    grouped.group_size = 32
    int4 = Int4Linear.from_linear(dense, 32).prepare("native").drop_saved_scales()  # q s + min
    return {
        "int8": Int8Linear.from_linear(dense).prepare("native"),
        "int8/32": grouped.prepare("native"),
        "int4": int4,
        "Q4_K+Q6_K": BlockLinear(
            256, n, [("Q4_K", _rows("Q4_K", 24, 256)), ("Q6_K", _rows("Q6_K", 16, 256, 1))]
        ),
        "Q8_0": BlockLinear(k, n, [("Q8_0", _rows("Q8_0", n, k))]),
        "Q5_0": BlockLinear(k, n, [("Q5_0", _rows("Q5_0", n, k))]),
    }


LINEARS = _linears()


@pytest.mark.parametrize("name", list(LINEARS))
def test_int8_weights_are_torchs_rounding_of_the_floats(name):
    m = LINEARS[name]
    w = m.dequantized(torch.float32)
    c = torch.rand(m.in_features).add(0.25)
    for scaled in (None, c):
        got = int8_weights(m, scaled)
        assert got is not None
        q, s = (t.clone() for t in got[:2])
        want_q, want_s = quantize_int8(w if scaled is None else w * c)
        assert torch.equal(s, want_s)
        assert torch.equal(q, want_q)
        assert q.abs().max() == 127


def test_the_weights_column_maxima_are_kept_and_exact():
    m = LINEARS["Q4_K+Q6_K"]
    x = torch.randn(40, m.in_features)
    m.__dict__.pop("_int8_colmax", None)
    int8_matmul(m, x)
    assert torch.equal(m._int8_colmax, m.dequantized(torch.float32).abs().amax(0))


@pytest.mark.parametrize("name", list(LINEARS))
def test_int8_matmul_near_the_float_product(name):
    # the rounding of both operands to int8 per row (after smoothing): within 2% of the float
    # product's norm on random inputs with an outlier channel; the exact integer steps are
    # checked against torch below
    m = LINEARS[name]
    torch.manual_seed(1)
    x = torch.randn(48, m.in_features)
    x[:, 3] *= 30  # an outlier channel, as a real model's
    want = x @ m.dequantized(torch.float32).T
    got = int8_matmul(m, x)
    assert got is not None and got.shape == want.shape and got.dtype == torch.float32
    assert (got - want).norm() / want.norm() < 2e-2


def _steps(m, x, topk):
    # smoothing, the outlier columns out, each row's topk largest out, int8 rows, _int_mm and
    # the scales, then the outliers' exact float products, step by step in torch
    w = m.dequantized(torch.float32)
    x_max, w_max = x.abs().amax(0).clamp(min=FLOOR), w.abs().amax(0).clamp(min=FLOOR)
    c = x_max.pow(SMOOTH) / w_max.pow(1 - SMOOTH)
    cols = (x_max / c).topk(min(OUTLIERS, m.in_features // 4)).indices
    keep = torch.ones(m.in_features)
    keep[cols] = 0
    xs = x * torch.reciprocal(c) * keep
    top = xs.abs().topk(topk, dim=1).indices if topk else None
    sparse = (
        torch.zeros_like(xs)
        if top is None
        else torch.zeros_like(xs).scatter_(1, top, xs.gather(1, top))
    )
    qx, sx = quantize_int8(xs - sparse)
    qw, sw = quantize_int8(w * c * keep)
    want = torch._int_mm(qx, qw.t()).float() * (sx[:, None] * sw[None, :])
    return want + sparse @ (w * c * keep).T + x[:, cols] @ w[:, cols].T


@pytest.mark.parametrize("role", ["input", "output"])
def test_int8_matmul_is_its_integer_steps(role):
    m = BlockLinear(96, 40, [("Q8_0", _rows("Q8_0", 40, 96))])
    m.prefill_role = role
    x = torch.randn(40, m.in_features)
    want = _steps(m, x, ROW_OUTLIERS if role == "output" else 0)
    torch.testing.assert_close(int8_matmul(m, x), want, rtol=1e-5, atol=1e-5)


def test_the_row_outliers_bring_heavy_rows_nearer():
    # a row's own few huge entries (the attention's or the gate's output): set aside per row,
    # in float, the error falls well below the per-row scale's alone; the head stays in bf16
    m = BlockLinear(96, 40, [("Q5_0", _rows("Q5_0", 40, 96))])
    torch.manual_seed(3)
    x = torch.randn(64, m.in_features)
    x[torch.arange(64), torch.randint(0, 96, (64,))] *= 60.0
    want = x @ m.dequantized(torch.float32).T
    err = {}
    for role in ("input", "output"):
        m.prefill_role = role
        err[role] = ((int8_matmul(m, x) - want).norm() / want.norm()).item()
    assert err["output"] < 0.5 * err["input"]
    m.prefill_role = "logits"
    assert int8_matmul(m, x) is None


def test_a_gpts_roles():
    from lamina.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=32, block_size=8, d_model=16, n_layers=2, n_heads=2))
    mark_roles(model)
    block = model.blocks[1]
    assert block.attn.proj.prefill_role == block.ff.proj.prefill_role == "output"
    assert model.head.prefill_role == "logits"
    assert getattr(block.attn.qkv, "prefill_role", "input") == "input"


def test_the_outlier_columns_bring_the_product_nearer(monkeypatch):
    # a few wide input columns (a real model's massive activations): out of the int8 product,
    # in float, the error falls well below smoothing's alone
    m = LINEARS["Q4_K+Q6_K"]
    torch.manual_seed(2)
    x = torch.randn(64, m.in_features)
    x[:, [5, 77, 130, 200]] *= torch.tensor([80.0, -60.0, 120.0, 40.0])
    want = x @ m.dequantized(torch.float32).T
    err = {}
    for n in (0, 4):
        monkeypatch.setattr(int8mm, "OUTLIERS", n)
        err[n] = ((int8_matmul(m, x) - want).norm() / want.norm()).item()
    assert err[4] < 0.7 * err[0]


def test_the_split_columns_are_the_exact_floats():
    m = LINEARS["Q5_0"]
    w = m.dequantized(torch.float32)
    cols = torch.tensor([9, 2, 40, 41], dtype=torch.int32)
    got = int8_weights(m, torch.rand(m.in_features), cols)
    assert torch.equal(got[2], w[:, cols].T)


def test_scaling_back_with_a_bias_in_place():
    lib = library()
    acc = torch.randint(-(2**20), 2**20, (5, 19), dtype=torch.int32)
    sa, sw, bias = torch.rand(5), torch.rand(19), torch.randn(19)
    want = acc.float() * (sa[:, None] * sw[None, :]) + bias
    y = acc.view(torch.float32)
    assert lib.lm_i8_scale(
        acc.data_ptr(),
        sa.data_ptr(),
        sw.data_ptr(),
        bias.data_ptr(),
        5,
        19,
        y.data_ptr(),
        None,
        2,
    )
    assert torch.equal(y, want)


def test_odd_widths_and_few_rows_quantize_as_torch():
    lib = library()
    for rows, k in ((1, 7), (3, 45), (33, 100)):
        x = torch.randn(rows, k)
        q, s = torch.empty(rows, k, dtype=torch.int8), torch.empty(rows)
        assert lib.lm_quant_rows_i8(
            x.data_ptr(), rows, k, None, q.data_ptr(), s.data_ptr(), 0, None, None, 2
        )
        want_q, want_s = quantize_int8(x)
        assert torch.equal(q, want_q) and torch.equal(s, want_s)


def test_unread_kinds_and_refused_shapes_give_none():
    lib = library()
    assert int8_matmul(torch.nn.Linear(8, 8), torch.randn(40, 8)) is None
    bad = torch.zeros(4, 64, dtype=torch.int8)
    s = torch.ones(4, 2)
    out, ys = torch.empty(4, 64, dtype=torch.int8), torch.empty(4)
    args = (bad.data_ptr(), s.data_ptr(), None, 4, 64)
    rest = (out.data_ptr(), ys.data_ptr(), None, 0, None, 0, 0, None, None, None, 1)
    assert not lib.lm_dequant_i8(2, *args, 3, None, *rest)  # gs 3
    assert not lib.lm_dequant_i8(1, *args, 32, None, *rest)  # no mn
    assert not lib.lm_dequant_i8(3, *args, 0, None, *rest)  # Q4_K, k 64


@pytest.fixture
def switch():
    before = list(cpu._int8_switch)
    yield cpu.int8_prefill
    cpu._int8_switch[:] = before


def test_the_switch_and_the_policy(switch, monkeypatch):
    m = LINEARS["Q5_0"]
    x = torch.randn(64, m.in_features)
    if not cpu.native_int8():
        switch(True)
        assert not cpu.prefill_int8(x)
        return
    monkeypatch.delenv(cpu.INT8_ENV, raising=False)
    cpu._int8_switch.clear()
    assert not cpu.int8_prefill() and not cpu.prefill_int8(x)  # off by default
    monkeypatch.setenv(cpu.INT8_ENV, "1")
    assert cpu.int8_prefill() and cpu.prefill_int8(x)
    with torch.no_grad():
        on = dequantized_matmul(m, x)
        switch(False)
        assert not cpu.prefill_int8(x)
        off = dequantized_matmul(m, x)
    assert torch.equal(on, int8_matmul(m, x))
    assert not torch.equal(on, off)  # off: the bf16 path (or fp32 where bf16 is not native)
    switch(True)
    assert not cpu.prefill_int8(x[: cpu.MAX_ROWS])  # short calls: the native kernel's
    assert not cpu.prefill_int8(x.double())
    assert not cpu.prefill_int8(x.requires_grad_())  # training records gradients
    with torch.no_grad():
        x = x.detach()
        with kept_dequantization():  # lamina train's kept dequantizations: not int8
            assert not torch.equal(dequantized_matmul(m, x), int8_matmul(m, x))
    with cpu.using("dequantize"):
        assert not cpu.prefill_int8(x)  # the float reference
    cpu._int8_switch.clear()
    monkeypatch.setenv(cpu.INT8_ENV, "0")
    assert not cpu.int8_prefill()
    monkeypatch.setenv(cpu.INT8_ENV, "yes")
    with pytest.raises(LaminaError, match=cpu.INT8_ENV):
        cpu.int8_prefill()

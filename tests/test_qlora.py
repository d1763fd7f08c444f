"""QLoRA (--lora-base): a GGUF base kept as its blocks, int8/int4 made a layer at a time; the
adapters train over it with the gradients of the dequantized matmul, and the base stays
quantized (no float copy of a linear or the table is kept)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lamina import GPT, GPTConfig, LaminaError
from lamina import frozen_linear as fl
from lamina.frozen_linear import FrozenLinear, frozen_linear
from lamina.lora import LoRAConfig, apply_lora, lora_parameters
from lamina.quant import Int4Linear, Int8Embedding, Int8Linear
from lamina.quant.from_blocks import from_blocks
from lamina.quant.ggml import dequantize_rows, row_bytes
from lamina.training.qlora import HeadRows, base_bytes, base_model

gguf = pytest.importorskip("gguf")

CFG = GPTConfig(vocab_size=96, block_size=16, d_model=64, n_heads=4, n_layers=2, norm="rms",
                positions="rope", activation="swiglu", n_kv_heads=2, bias=False,
                tie_weights=True)  # fmt: skip


def _pair(table: str) -> tuple[GPT, GPT]:
    """(the model from GGUF blocks: Q4_1 linears, `table` token table; its fp32 twin)."""
    torch.manual_seed(0)
    model = GPT(CFG).eval()
    state, qtypes = {}, {}
    for name, t in model.state_dict().items():
        if name == "head.weight":
            continue
        if t.dim() == 2:
            qtype = table if name == "embed.wte.weight" else "Q4_1"
            raw = gguf.quants.quantize(t.numpy(), gguf.GGMLQuantizationType[qtype])
            state[name], qtypes[name] = row_bytes(raw, qtype, tuple(t.shape)), qtype
        else:
            state[name] = t.clone()
    twin = GPT(CFG).eval()
    widths = {k: t.shape[-1] for k, t in model.state_dict().items()}
    floats = {k: dequantize_rows(v, qtypes[k], widths[k]) if k in qtypes else v
              for k, v in state.items()}  # fmt: skip
    twin.load_state_dict(floats | {"head.weight": floats["embed.wte.weight"]})
    with torch.device("meta"):
        empty = GPT(CFG)
    return from_blocks(empty, state, qtypes), twin


def _step_grads(model: GPT, ids: torch.Tensor) -> list[torch.Tensor]:
    torch.manual_seed(1)
    apply_lora(model, LoRAConfig(r=4, alpha=8, dropout=0.0, targets="qv"))
    for p in lora_parameters(model):
        nn.init.normal_(p, std=0.05)  # B nonzero, so every adapter gets a gradient
    model.train()
    F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
    return [p.grad for p in lora_parameters(model)]


@pytest.mark.parametrize("table", ["Q4_1", "Q8_0"])
def test_adapters_train_over_a_kept_gguf_base_as_over_its_float_twin(table):
    q, twin = _pair(table)
    base_model(q, "keep")
    assert all(isinstance(b.attn.qkv, Int4Linear) and isinstance(b.ff.proj, Int4Linear)
               for b in q.blocks)  # fmt: skip
    if table == "Q4_1":  # the fp32 table the loader made is gone: lookups read the int4 head
        assert isinstance(q.embed.wte, HeadRows)
    else:
        assert isinstance(q.embed.wte, Int8Embedding) and isinstance(q.head.base, Int8Linear)
    assert not [n for n, m in q.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))]
    assert base_bytes(q) < 0.4 * base_bytes(twin)
    ids = torch.randint(0, 96, (2, 13))
    with torch.no_grad():
        torch.testing.assert_close(q(ids), twin(ids), atol=1e-4, rtol=1e-4)
    for got, want in zip(_step_grads(q, ids), _step_grads(twin, ids), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)
    assert all(not t.requires_grad for t in q.buffers())  # the base is still its blocks


def test_int8_and_int4_are_made_a_layer_at_a_time_from_a_float_base():
    _, twin = _pair("Q8_0")
    for scheme, kind in (("int8", Int8Linear), ("int4", Int4Linear)):
        model = GPT(CFG).eval()
        model.load_state_dict(twin.state_dict())
        base_model(model, scheme)
        assert all(isinstance(b.ff.fc, kind) for b in model.blocks)
        # a tied head becomes one int8 table serving lookups and the head
        assert model.head.base.qweight.data_ptr() == model.embed.wte.qweight.data_ptr()
        assert model.quantization["scheme"] == scheme
    with pytest.raises(LaminaError, match="--lora-base keep"):
        base_model(GPT(CFG), "keep")


def test_the_dequantized_matmul_gives_the_input_its_gradient_in_chunks(monkeypatch):
    monkeypatch.setattr(fl, "CHUNK", 16)  # 96 rows: six chunks
    q, _ = _pair("Q4_1")
    head = q.head
    from lamina.training.qlora import int4_rows

    rows = lambda a, b, dtype, out=None: int4_rows(head, slice(a, b), dtype, out)  # noqa: E731
    x = torch.randn(3, 5, 64, requires_grad=True)
    w = head.dequantized()
    for reader in (None, rows):
        y = frozen_linear(x, head, reader)
        torch.testing.assert_close(y, x @ w.T)
        (gx,) = torch.autograd.grad(y.square().sum(), x)
        (want,) = torch.autograd.grad((x @ w.T).square().sum(), x)
        torch.testing.assert_close(gx, want)
    with torch.no_grad():  # given rows, the eval path reads them in chunks too
        torch.testing.assert_close(FrozenLinear(head, rows)(x), x @ w.T)
    assert np.isclose(float(int4_rows(head, torch.tensor([5]))[0, 3]), float(w[5, 3]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantizing_into_a_buffer_gives_the_same_numbers(dtype):
    torch.manual_seed(0)
    lin = nn.Linear(128, 48)
    int4, grouped = Int4Linear.from_linear(lin, 32), Int8Linear.from_linear(lin)
    grouped.qweight, grouped.scale = int4.dequantized().round().to(torch.int8), torch.rand(48, 4)
    grouped.group_size = 32
    for m in (int4, Int8Linear.from_linear(lin), grouped):
        for rows in (None, slice(5, 29), torch.tensor([3, 0, 47])):
            want = m.dequantized(dtype, rows=rows)
            out = torch.full((want.shape[0], 128), float("nan"))
            got = m.dequantized(dtype, rows=rows, out=out)
            assert torch.equal(got, want), (type(m).__name__, rows)
            if dtype == torch.float32 and (rows is not None or not isinstance(m, Int8Linear)):
                assert got.data_ptr() == out.data_ptr()  # written into it, not made anew


def test_the_step_dequantizes_into_kept_buffers_not_fresh_tensors(monkeypatch):
    monkeypatch.setattr(fl, "CHUNK", 16)
    q, _ = _pair("Q4_1")
    from lamina.training.qlora import int4_rows

    head = q.head
    rows = lambda a, b, dtype, out=None: int4_rows(head, slice(a, b), dtype, out)  # noqa: E731
    x = torch.randn(2, 3, 64, requires_grad=True)
    layer = q.blocks[0].ff.proj  # an Int4Linear: its own call on 40 rows runs dequantized

    def ptrs() -> set[int]:
        return {p.data_ptr() for _, p in fl.pieces(head, rows, torch.float32)}

    outside = [ptrs(), ptrs()]
    h = torch.randn(40, layer.in_features)
    with fl.kept_dequantization():
        seen = []
        for dtype in (torch.float32, torch.bfloat16, torch.float32):
            with torch.no_grad(), fl.kept_dequantization():  # nested: the same buffers
                want = h @ layer.dequantized().T
                torch.testing.assert_close(layer(h), want, rtol=0.02, atol=0.02)
                kept = fl.dequantized(layer, dtype)
                assert kept.data_ptr() in {b.data_ptr() for b in fl._KEPT.buffers.values()}
            seen.append(ptrs())
            y = frozen_linear(x, head, rows)
            torch.testing.assert_close(y, x @ head.dequantized().T)
        assert seen[0] == seen[1] == seen[2] and len(seen[0]) == 1  # one buffer: every piece
    assert fl._KEPT.buffers == {}  # freed on leaving
    assert len(outside[0]) > 1  # outside, each piece is a fresh tensor


@pytest.mark.parametrize("scheme", ["keep", "int8", "int4"])
def test_frozen_head_loss_through_a_quantized_head_equals_the_full_logits(scheme, monkeypatch):
    import lamina.training.chunked_ce as ce
    from lamina.training.chunked_ce import frozen_head_loss, frozen_head_nll
    from lamina.training.lm import lm_loss

    monkeypatch.setattr(ce, "HEAD_CHUNK", 7)  # 3 x 12 rows: six chunks, the last one short
    monkeypatch.setattr(fl, "CHUNK", 40)  # 96 head rows: three pieces, the last one short
    q, twin = _pair("Q4_1")
    model = base_model(q if scheme == "keep" else twin, scheme)
    assert type(model.head) is FrozenLinear and model.head.rows is not None
    torch.manual_seed(1)
    apply_lora(model, LoRAConfig(r=4, alpha=8, dropout=0.0, targets="all"))
    for p in lora_parameters(model):
        nn.init.normal_(p, std=0.05)
    model.train()
    ids = torch.randint(0, 96, (3, 13), generator=torch.Generator().manual_seed(2))
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    results = []
    for fn in (lambda m: lm_loss(m(x), y), lambda m: frozen_head_loss(m, x, y)):
        loss = fn(model)
        (loss * 0.5).backward()  # the kept gradient is scaled by grad_out
        results.append((loss.detach(), [p.grad.clone() for p in lora_parameters(model)]))
        model.zero_grad(set_to_none=True)
    (want, want_g), (got, got_g) = results
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_g, want_g, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    with torch.no_grad():  # the evaluation's nll through the same chunks
        logits = model.eval()(x)
        nll = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
        torch.testing.assert_close(frozen_head_nll(model, x, y), nll, rtol=1e-5, atol=1e-5)

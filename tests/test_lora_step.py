"""The LoRA step's fast paths: the frozen head's loss (gradients made in the forward, no logits
kept) and a float base held in bf16 under bf16 autocast compute what the plain step computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lamina import GPT, GPTConfig
from lamina.data.instruct import IGNORE
from lamina.lora import apply_lora, lora_parameters
from lamina.training.chunked_ce import frozen_head_loss, frozen_head_nll
from lamina.training.lm import eval_nll, lm_loss
from lamina.training.lora_option import base_note, hold_base
from lamina.training.sft import row_losses

CFG = dict(
    vocab_size=67, block_size=16, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=48,
    positions="rope", norm="rms", activation="swiglu", qkv_bias=False, bias=False,
)  # fmt: skip


def _lora_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = apply_lora(GPT(GPTConfig(**CFG)), r=4, alpha=8, dropout=0.0, targets="all")
    with torch.no_grad():
        for p in lora_parameters(model):
            p.normal_(0, 0.2)  # B non-zero: the adapters matter
    return model.train()


def _batch(n: int = 3, t: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 67, (n, t + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def _loss_and_grads(model, fn, bf16=False):
    x, y = _batch()
    with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        loss = fn(model, x, y)
    (loss * 0.5).backward()  # a grad_out other than 1 reaches the kept gradient scaled
    grads = [p.grad.clone() for p in lora_parameters(model)]
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _plain(model, x, y):
    return lm_loss(model(x), y)


@pytest.mark.parametrize("bf16", [False, True])
def test_frozen_head_loss_equals_the_full_logits_path(bf16, monkeypatch):
    import lamina.frozen_linear as fl
    import lamina.training.chunked_ce as ce

    monkeypatch.setattr(ce, "HEAD_CHUNK", 5)  # several chunks, the last one short
    monkeypatch.setattr(fl, "CHUNK", 13)  # the head read in pieces, the last one short
    model = _lora_model()
    want, want_g = _loss_and_grads(model, _plain, bf16)
    got, got_g = _loss_and_grads(model, frozen_head_loss, bf16)
    tol = dict(rtol=2e-2, atol=2e-3) if bf16 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, want, **tol)
    for g, w in zip(got_g, want_g, strict=True):
        torch.testing.assert_close(g, w, **tol)


@pytest.mark.parametrize("bf16", [False, True])
def test_frozen_head_nll_equals_the_full_logits_per_position(bf16, monkeypatch):
    import lamina.frozen_linear as fl
    import lamina.training.chunked_ce as ce

    monkeypatch.setattr(ce, "HEAD_CHUNK", 5)
    monkeypatch.setattr(fl, "CHUNK", 13)
    model, (x, y) = _lora_model().eval(), _batch()
    y = y.clone()
    y[0, :4] = IGNORE  # an ignored target scores 0 and is skipped
    with torch.autocast("cpu", torch.bfloat16, enabled=bf16), torch.no_grad():
        logits = model(x).float()
        got = frozen_head_nll(model, x, y)
        via_eval = eval_nll(model, x, y)  # the LM objective's evaluation takes this path
    want = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
    assert got.shape == y.shape and torch.all(got[0, :4] == 0)
    tol = dict(rtol=2e-2, atol=2e-2) if bf16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, **tol)
    assert via_eval.equal(got)


def test_frozen_head_loss_with_ignored_targets_equals_sft_row_losses(monkeypatch):
    import lamina.frozen_linear as fl
    import lamina.training.chunked_ce as ce

    monkeypatch.setattr(ce, "HEAD_CHUNK", 5)
    monkeypatch.setattr(fl, "CHUNK", 13)
    model = _lora_model()
    x, y = _batch()
    y = y.clone()
    y[0, :7], y[1, 2:5], y[2, :] = IGNORE, IGNORE, IGNORE  # prompts; a row with no target
    for rows_mean in (False, True):
        if rows_mean:
            plain = lambda m, x, y: row_losses(m(x), y).mean()  # noqa: E731
        else:
            plain = lambda m, x, y: F.cross_entropy(m(x).flatten(0, 1), y.flatten())  # noqa: E731
        fused = lambda m, x, y, r=rows_mean: frozen_head_loss(m, x, y, rows_mean=r)  # noqa: E731
        results = []
        for fn in (plain, fused):
            loss = fn(model, x, y)
            (loss * 0.5).backward()
            results.append((loss.detach(), [p.grad.clone() for p in lora_parameters(model)]))
            model.zero_grad(set_to_none=True)
        (want, want_g), (got, got_g) = results
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for g, w in zip(got_g, want_g, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_frozen_head_loss_declines_a_head_that_trains():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**CFG))
    x, y = _batch()
    assert frozen_head_loss(model, x, y) is None  # its head learns: the full logits path


def test_a_bf16_held_base_computes_what_autocast_computes():
    model, x = _lora_model(), _batch()[0]
    with torch.autocast("cpu", torch.bfloat16), torch.no_grad():
        before = model(x)
    assert base_note(model) == ", LoRA base float32"
    assert hold_base(model, bf16=False) == 0  # fp32 runs keep the fp32 base
    assert hold_base(model, bf16=True) == 4 * 2  # qkv, proj, fc, proj per block
    assert base_note(model) == ", LoRA base bf16"
    assert all(p.dtype == torch.float32 for p in lora_parameters(model))
    assert model.blocks[0].attn.qkv.base.weight.dtype == torch.bfloat16
    with torch.autocast("cpu", torch.bfloat16), torch.no_grad():
        assert torch.equal(model(x), before)  # autocast rounded the same weights the same way
    with torch.no_grad():
        plain = model(x)  # no autocast: the held linears still run, fp32 in and out
    assert plain.dtype == torch.float32 and torch.isfinite(plain).all()


def test_lora_dropout_recomputed_in_the_backward_gives_the_plain_gradients(monkeypatch):
    """With dropout, the adapters' input is dropped again in the backward (lora._down under a
    checkpoint, the RNG state kept): the same loss and gradients as keeping the dropped copy."""
    import lamina.lora as lora_module

    torch.manual_seed(0)
    model = apply_lora(GPT(GPTConfig(**CFG)), r=4, alpha=8, dropout=0.3, targets="all")
    with torch.no_grad():
        for p in lora_parameters(model):
            p.normal_(0, 0.2)
    model.train()
    kept = []
    for recompute in (True, False):
        if not recompute:
            monkeypatch.setattr(lora_module, "checkpoint", lambda fn, *a, **_: fn(*a))
        torch.manual_seed(5)
        kept.append(_loss_and_grads(model, _plain))
    (got, got_g), (want, want_g) = kept
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for g, w in zip(got_g, want_g, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    torch.manual_seed(6)
    other, _ = _loss_and_grads(model, _plain)
    assert not torch.equal(other, want)  # dropout is on: another draw gives another loss

"""Issue 36's step levers: the chunked cross-entropy equals the full one (value and gradients);
the fused AdamW step equals the for-loop one over a few steps; the budget table picks as
documented."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lamina import GPT, GPTConfig
from lamina.errors import LaminaError
from lamina.training.chunked_ce import chunked_cross_entropy, lm_loss_chunked
from lamina.training.optim import build_optimizer


@pytest.mark.parametrize("chunk", [1, 5, 7, 64])
def test_chunked_cross_entropy_equals_full_value_and_gradients(chunk):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(23, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 8, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 11, (23,), generator=g)
    full = F.cross_entropy(h @ w.T, y)
    gh, gw = torch.autograd.grad(full, (h, w))
    got = chunked_cross_entropy(h, w, y, chunk=chunk)
    ch, cw = torch.autograd.grad(got * 3.0, (h, w))  # a non-unit upstream gradient
    torch.testing.assert_close(got, full, rtol=0, atol=1e-12)
    torch.testing.assert_close(ch, 3.0 * gh, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(cw, 3.0 * gw, rtol=1e-9, atol=1e-12)


def test_chunked_lm_loss_equals_the_models_full_loss_and_gradients():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=20, block_size=16))
    x, y = torch.randint(0, 20, (3, 16)), torch.randint(0, 20, (3, 16))
    full = F.cross_entropy(model(x).view(-1, 20), y.view(-1))
    want = torch.autograd.grad(full, list(model.parameters()))
    got = lm_loss_chunked(model, x, y, chunk=10)
    have = torch.autograd.grad(got, list(model.parameters()))
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-6)
    for a, b in zip(have, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_chunked_cross_entropy_refuses_bad_input_by_name():
    with pytest.raises(LaminaError, match="chunk must be at least 1"):
        chunked_cross_entropy(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2).long(), 0)
    with pytest.raises(LaminaError, match="targets"):
        chunked_cross_entropy(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(3).long())


def _train(fused: bool, steps: int = 4) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=20, block_size=16))
    opt = build_optimizer(model, lr=1e-2, fused=fused)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = (
            torch.randint(0, 20, (2, 16), generator=g),
            torch.randint(0, 20, (2, 16), generator=g),
        )
        F.cross_entropy(model(x).view(-1, 20), y.view(-1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()]


def test_fused_adamw_steps_equal_the_for_loop_steps():
    fused, plain, start = _train(True), _train(False), _train(True, steps=0)
    for a, b in zip(fused, plain, strict=True):
        # 4 steps of lr 1e-2 move a weight up to 4e-2; the two kernels' rounding is < 1% of that
        torch.testing.assert_close(a, b, rtol=0, atol=2e-4)
    assert max((a - s).abs().max() for a, s in zip(fused, start, strict=True)) > 1e-2


def test_budget_table_picks_bpe_only_where_the_budget_reads_the_corpus_few_times():
    from lamina.training.budget import TABLE, passes, pick

    bpe, long = TABLE[0], TABLE[1]
    rate = 40_000.0  # bytes a second, made up
    enough = int(rate * bpe.seconds / bpe.passes) + 1  # the fewest bytes read at most `passes`
    assert passes(bpe.seconds, enough, rate) <= bpe.passes
    assert pick(bpe.seconds, enough, rate).train == bpe.train
    assert pick(bpe.seconds - 1, enough, rate).tokenizer == "char"  # too short a budget
    # more passes (a smaller corpus, a longer budget, a faster machine): the long row
    assert pick(bpe.seconds, enough - 2, rate).train == long.train
    assert pick(bpe.seconds * 2, enough, rate).train == long.train
    assert pick(bpe.seconds, enough, rate * 2).train == long.train
    assert pick(bpe.seconds * 2, enough, rate / 2).train == bpe.train  # a slower one
    assert pick(bpe.seconds * 10, None, rate).tokenizer == "char"  # a corpus of unknown size
    longest = TABLE[2]  # past the long row's passes: dropout outside the attention added
    beyond = pick(bpe.seconds * (long.passes / bpe.passes + 1), enough, rate)
    assert beyond.shape == longest.shape and beyond.train == longest.train
    many = TABLE[-2].passes / bpe.passes + 1  # past every BPE row's passes: nothing measured, char
    assert pick(bpe.seconds * many, enough, rate).tokenizer == "char"


def test_the_long_rows_keep_the_bpe_recipe_with_more_weight_decay_then_dropout():
    """Past the BPE row's passes the same tokenizer and shape train with more weight decay (0.6
    overfit there); past the long row's, dropout outside the attention is added (the run without
    it overfit at 900 s), the attention's own dropout 0 (SDPA's fused kernel stays)."""
    from lamina.training.budget import TABLE

    bpe, long, longest, char = TABLE
    assert (long.tokenizer, long.shape, long.seconds) == (bpe.tokenizer, bpe.shape, bpe.seconds)
    assert long.train["weight_decay"] > bpe.train["weight_decay"]
    assert (longest.tokenizer, longest.seconds, longest.train) == (
        long.tokenizer,
        long.seconds,
        long.train,
    )
    extra = {k: v for k, v in longest.shape.items() if k not in long.shape}
    assert {k: longest.shape[k] for k in long.shape} == long.shape
    assert (
        extra["dropout"] > 0
        and extra["attn_dropout"] == 0
        and set(extra) == {"dropout", "attn_dropout"}
    )
    assert bpe.passes < long.passes < longest.passes < float("inf") and char.passes == float("inf")


def test_text_rate_times_the_default_shape_and_leaves_the_rng_alone():
    import torch

    from lamina.training.budget import text_rate

    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    rate = text_rate("cpu", "fp32")
    assert 0 < rate < float("inf")
    assert torch.equal(torch.rand(3), want)


def test_budget_plan_keeps_explicit_flags_and_says_what_it_picked(tmp_path, monkeypatch):
    from lamina.training import budget
    from lamina.training.budget import TABLE, plan

    rate = 40_000.0
    monkeypatch.setattr(budget, "text_rate", lambda *a: rate)  # a machine of known speed
    big = tmp_path / "big.txt"
    enough = rate * TABLE[0].seconds / TABLE[0].passes
    big.write_text("to be or not to be\n" * int(enough // 19 + 1), encoding="utf-8")
    long = TABLE[0].seconds
    given, line = plan({"data": str(big), "max_time": long})
    assert given["tokenizer"] == TABLE[0].tokenizer and TABLE[0].tokenizer in line
    assert "pass --tokenizer" in line and "passes as BPE" in line
    longer, line = plan({"data": str(big), "max_time": 2 * long})  # 2x the passes: long row
    assert longer["tokenizer"] == TABLE[1].tokenizer and longer["weight_decay"] > 0.6
    assert f"--weight-decay {TABLE[1].train['weight_decay']:g}" in line and "--dropout" not in line
    longest, line = plan({"data": str(big), "max_time": 4 * long})  # 4x: dropout added
    assert longest["model_overrides"] == TABLE[2].shape and "--dropout 0.1" in line
    assert "--attn-dropout 0" in line and longest["weight_decay"] == TABLE[2].train["weight_decay"]
    most = (TABLE[-2].passes / TABLE[0].passes + 1) * long  # past every BPE row's passes
    assert plan({"data": str(big), "max_time": most})[0]["tokenizer"] == "char"
    typed_flags = ({"tokenizer": "char"}, {"preset": "tiny"}, {"init_from": "x"},
                   {"model_overrides": {"d_model": 64}})  # fmt: skip
    for typed in typed_flags:
        want = {"data": str(big), "max_time": long, **typed}
        assert plan(want) == (want, None)
    assert plan({"data": str(big)}) == ({"data": str(big)}, None)  # no budget: no plan
    assert plan({"data": str(big), "max_time": long, "task": "classify"})[1] is None
    small = tmp_path / "small.txt"
    small.write_text("short text\n", encoding="utf-8")
    assert plan({"data": str(small), "max_time": long})[0]["tokenizer"] == "char"


def test_a_budget_row_with_a_shape_sets_the_model_fields_and_says_so(tmp_path, monkeypatch):
    from lamina.training import budget

    row = budget.Row(60.0, float("inf"), "bpe:300", {"d_model": 64, "n_layers": 2}, "measured")
    monkeypatch.setattr(budget, "TABLE", (row, *budget.TABLE))
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be\n", encoding="utf-8")
    given, line = budget.plan({"data": str(text), "max_time": 60.0})
    assert given["tokenizer"] == "bpe:300"
    assert given["model_overrides"] == {"d_model": 64, "n_layers": 2}
    assert "--d-model 64, --n-layers 2 (measured;" in line


def test_a_budget_row_with_training_fields_sets_those_not_given(tmp_path, monkeypatch):
    from lamina.training import budget

    row = budget.Row(60.0, float("inf"), "bpe:300", {}, "measured", {"weight_decay": 0.7})
    monkeypatch.setattr(budget, "TABLE", (row, *budget.TABLE))
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be\n", encoding="utf-8")
    given, line = budget.plan({"data": str(text), "max_time": 60.0})
    assert given["weight_decay"] == 0.7 and "--weight-decay 0.7 (measured;" in line
    assert "model_overrides" not in given
    typed, line = budget.plan({"data": str(text), "max_time": 60.0, "weight_decay": 0.2})
    assert typed["weight_decay"] == 0.2 and "weight-decay" not in line  # a typed flag wins
    assert typed["tokenizer"] == "bpe:300"


def test_the_bpe_row_raises_weight_decay_and_the_char_row_keeps_the_default():
    from lamina.training.budget import TABLE

    bpe, char = TABLE[0], TABLE[-1]
    assert bpe.tokenizer.startswith("bpe:") and bpe.train["weight_decay"] > 0.1
    assert char.tokenizer == "char" and "weight_decay" not in char.train


def test_the_bpe_row_trains_rotary_positions_on_the_cpu_default_shape(tmp_path, monkeypatch):
    """The BPE row's one model field is rotary positions: the plan sets it, the CPU default
    shape (3 layers, no dropout) is kept around it, and the model has no position table."""
    from lamina import GPT, GPTConfig
    from lamina.training import budget
    from lamina.training.config import TrainConfig
    from lamina.training.registry import resolve

    bpe = budget.TABLE[0]
    assert bpe.shape == {"positions": "rope"}
    monkeypatch.setattr(budget, "text_rate", lambda *a: 10.0)  # a slow machine: few passes
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be\n" * 200, encoding="utf-8")
    given, line = budget.plan({"data": str(text), "max_time": bpe.seconds})
    assert given["tokenizer"] == bpe.tokenizer and "--positions rope" in line
    cfg = resolve(TrainConfig(**given), "cpu")
    assert cfg.model_overrides == {"n_layers": 3, "dropout": 0.0, "positions": "rope"}
    model = GPT(GPTConfig.preset("char-cpu", vocab_size=64, **cfg.model_overrides))
    learned = GPT(GPTConfig.preset("char-cpu", vocab_size=64, n_layers=3))
    assert "embed.wpe.weight" in dict(learned.named_parameters())  # what rope leaves out
    assert model.config.positions == "rope" and "embed.wpe.weight" not in dict(
        model.named_parameters()
    )


def test_the_bpe_row_covers_the_points_where_bpe_measured_better():
    """tinyshakespeare (1,115,394 bytes) on the AMX Xeon, whose timed rate read ~98 kB/s:
    bpe:1536 beat char at 65 s, 114 s and 140 s (5.7, 10.0 and 12.3 timed passes); char won from
    16 timed passes (the EPYC at 300 s) against that row's weight decay, and the long row's
    weight decay beat both there: 300 s and 900 s on the EPYC (~77 kB/s timed: 21 and 62
    passes) pick it, as the Xeon's 300 s (26) does."""
    from lamina.training.budget import TABLE, pick

    corpus, rate = 1_115_394, 97_800.0
    assert pick(114, corpus, rate).tokenizer == pick(140, corpus, rate).tokenizer == "bpe:1536"
    assert pick(65, corpus, rate).tokenizer == "bpe:1536"  # nanoGPT's 2,000 steps, quiet
    assert pick(140, corpus, rate).train == TABLE[0].train
    assert pick(300, corpus, rate).train == TABLE[1].train
    assert pick(300, corpus, rate / 2).train == TABLE[1].train  # 13.2 passes: half as fast
    epyc = 77_000.0
    assert pick(300, corpus, epyc).train == pick(900, corpus, epyc).train == TABLE[1].train
    assert pick(300, corpus, epyc).shape == TABLE[1].shape  # 20.7 passes: no dropout (1.4787)
    assert pick(900, corpus, epyc).shape == TABLE[2].shape  # 62 passes: dropout (1.4519)
    assert pick(120, corpus, epyc).train == TABLE[0].train  # 8.3 passes: 1.4810 measured

"""The SFT objective (lamina.training.sft): assistant-only loss on the objective's own batches,
rows weighed equally, a resume draws the same rows, LoRA training lowers held-out loss."""

from __future__ import annotations

import torch

from lamina import GPT, GPTConfig
from lamina.data.instruct import IGNORE, pad_rows, parse_record
from lamina.lora import apply_lora, lora_parameters
from lamina.tokenizers.kinds import CharTokenizer
from lamina.training.sft import SFTObjective, row_losses, sft_rows

TOK = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz:?=+0123456789 \n")
PAIRS = [(f"is {n} even? ", "yes" if n % 2 == 0 else "no") for n in range(100)]


def _examples():
    return [parse_record({"prompt": p, "completion": c}, f"t{i}") for i, (p, c) in enumerate(PAIRS)]


def _objective(seed=0, train_on_prompt=False):
    rows, dropped = sft_rows(TOK, _examples(), 16, train_on_prompt)
    assert dropped == 0
    return SFTObjective(rows[:80], rows[80:], 16, seed, n_eval=2, eval_batch_size=10)


def _model():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=TOK.vocab_size, block_size=16, d_model=32, n_heads=4,
                         n_layers=2))  # fmt: skip


def test_prompt_targets_do_not_move_the_loss():
    """Targets built from rows whose prompt tokens were changed: the objective's loss stays;
    change a completion token instead (or train on the prompt) and it moves."""
    obj, model = _objective(), _model()
    rows = obj.train[:4]
    inputs, targets = pad_rows(rows, 16)
    base = obj.loss(model, (inputs, targets))

    def changed(where):
        out = []
        for ids, mask in rows:
            pos = next(i for i in range(1, len(ids)) if mask[i] == where)
            ids = list(ids)
            ids[pos] = (ids[pos] + 1) % TOK.vocab_size
            out.append((ids, mask))
        return pad_rows(out, 16)[1]

    assert torch.equal(obj.loss(model, (inputs, changed(False))), base)
    assert not torch.equal(obj.loss(model, (inputs, changed(True))), base)
    everything = [(ids, [True] * len(ids)) for ids, _ in rows]
    full = obj.loss(model, pad_rows(everything, 16))
    moved = [
        (list(ids[:1]) + [(ids[1] + 1) % TOK.vocab_size] + list(ids[2:]), m)
        for ids, m in everything
    ]
    assert not torch.equal(obj.loss(model, (inputs, pad_rows(moved, 16)[1])), full)


def test_every_row_weighs_the_same():
    logits = torch.randn(2, 5, 7)
    targets = torch.tensor([[1, IGNORE, IGNORE, IGNORE, IGNORE], [1, 2, 3, 4, 5]])
    per_row = row_losses(logits, targets)
    one = torch.nn.functional.cross_entropy(logits[0, :1], targets[0, :1])
    torch.testing.assert_close(per_row[0], one)
    halves = (row_losses(logits[:1], targets[:1]) + row_losses(logits[1:], targets[1:])) / 2
    torch.testing.assert_close(per_row.mean(), halves[0])


def test_resume_draws_the_same_rows():
    a = _objective(seed=3)
    a.draw(5)
    state = a.state_dict()
    want = a.draw(5)
    b = _objective(seed=99)
    b.load_state_dict(state)
    got = b.draw(5)
    assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True))


def test_lora_sft_lowers_held_out_loss():
    obj, model = _objective(), _model()
    apply_lora(model, r=4, alpha=8, dropout=0.0, targets="all")
    before = obj.evaluate(model, obj.eval_batches())["loss"]
    opt = torch.optim.AdamW(lora_parameters(model), lr=1e-2)
    model.train()
    for _ in range(40):
        loss = obj.loss(model, obj.draw(16))
        loss.backward()
        opt.step()
        opt.zero_grad()
    after = obj.evaluate(model, obj.eval_batches())["loss"]
    assert after < before - 0.5, (before, after)


def test_a_lora_models_loss_and_evaluation_equal_the_full_logits():
    """Over a frozen head the objective goes through chunked_ce (no full logits, the prompt
    tokens skipped): the same loss, gradients and held-out loss as from the logits."""
    obj, model = _objective(), _model()
    apply_lora(model, r=4, alpha=8, dropout=0.0, targets="all")
    with torch.no_grad():
        for p in lora_parameters(model):
            p.normal_(0, 0.2)
    batch = obj.draw(6)
    results = []
    for fn in (
        lambda: obj.loss(model, batch),
        lambda: row_losses(model(batch[0]), batch[1]).mean(),
    ):
        loss = fn()
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in lora_parameters(model)]))
        model.zero_grad(set_to_none=True)
    (got, got_g), (want, want_g) = results
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_g, want_g, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    model.eval()
    total = count = 0
    with torch.no_grad():
        for x, y in obj.eval_batches():
            logits = model(x).flatten(0, 1)
            total += float(torch.nn.functional.cross_entropy(logits, y.flatten(), reduction="sum"))
            count += int((y != IGNORE).sum())
    got = obj.evaluate(model, obj.eval_batches())
    assert got["target_tokens"] == count
    assert abs(got["loss"] - total / count) < 1e-5

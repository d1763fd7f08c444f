"""Issue 35, class 3: scoring stays within memory whatever the sizes (a very long choice, very
many choices), with the same log-likelihoods; KV caches that cannot fit are refused up front,
naming their size."""

from __future__ import annotations

import pytest
import torch

from lamina import GPT, GPTConfig, LaminaError
from lamina.evals import choice as choice_module
from lamina.evals.choice import ChoiceItem, score_items
from lamina.tokenizers.subword import ByteTokenizer


def _model(block: int = 64) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig.preset("llama-tiny", vocab_size=256, block_size=block, n_layers=2)
    return GPT(cfg).eval()


def _largest_logits(model: GPT, monkeypatch) -> list[int]:
    """Record the elements of every logits tensor the model returns."""
    sizes: list[int] = []
    forward = model.forward

    def recording(*args, **kwargs):
        out = forward(*args, **kwargs)
        sizes.append(out.numel())
        return out

    monkeypatch.setattr(model, "forward", recording)
    return sizes


@pytest.mark.parametrize("method", ["cache", "batch"])
@pytest.mark.parametrize(
    "item",
    [
        ChoiceItem("abc", ("x" * 200, "y"), 0),  # one choice far past the block
        ChoiceItem("the context", tuple(f"choice {i}" for i in range(60)), 7),  # many choices
    ],
    ids=["long-choice", "many-choices"],
)
def test_scoring_is_chunked_within_the_budget_with_the_same_sums(item, method, monkeypatch):
    model, tok = _model(), ByteTokenizer()
    want = score_items(model, tok, [item], method=method)[0].logliks  # budgets far above
    monkeypatch.setattr(choice_module, "LOGIT_BUDGET", 256 * 24)  # 24 positions of logits
    monkeypatch.setattr(choice_module, "MAX_ROWS", 8)
    sizes = _largest_logits(model, monkeypatch)
    got = score_items(model, tok, [item], method=method)[0].logliks
    assert max(sizes) <= 256 * 24 and len(sizes) > 2
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=2e-4, rtol=1e-5)


def test_kv_caches_that_cannot_fit_are_refused_naming_their_size():
    model = _model(block=2**31 - 1)  # a context as large as a GGUF may claim
    c = model.config
    gib = 2 * c.n_layers * c.kv_heads * 10**9 * c.head_dim * 4 / 2**30
    with pytest.raises(LaminaError, match=rf"KV caches for 1 x 1,000,000,000 .* {gib:.1f} GiB"):
        model.make_caches(1, 10**9)
    assert len(model.make_caches(2, 128)) == 2

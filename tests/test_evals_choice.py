"""Multiple-choice scoring (lamina.evals.choice): lm-eval's continuation rule, log-likelihoods
against an independent full forward, acc / acc_norm and their standard errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import CORPUS_TEXT

from lamina.errors import LaminaError
from lamina.evals.choice import (
    ChoiceItem,
    ItemScore,
    accuracy,
    encode_pair,
    mean_stderr,
    score_items,
)
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.tokenizers.subword import BPETokenizer, ByteTokenizer


def tiny_llama(vocab: int, block: int = 64) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=vocab, block_size=block, d_model=32, n_heads=4, n_layers=2,
                    positions="rope", norm="rms", activation="swiglu", n_kv_heads=2,
                    bias=False, qkv_bias=False, init_std=0.2)  # fmt: skip
    return GPT(cfg).eval()


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(CORPUS_TEXT, 300)


@pytest.fixture(scope="module")
def model(bpe) -> GPT:
    return tiny_llama(bpe.vocab_size)


ITEMS = [
    ChoiceItem("First Citizen:\nBefore we proceed", ("any further", "speak", "famish?"), 0),
    ChoiceItem("All:\nSpeak, ", ("speak.", "die", "resolved rather"), 1),  # trailing space
    ChoiceItem("You are all resolved rather to", ("die than to famish?", "x"), 1),
    ChoiceItem("", ("First Citizen", "All"), 0),  # empty context: the prefix token
]


def reference_logliks(model: GPT, tok, item: ChoiceItem, delimiter: str = " ") -> list[float]:
    """Each choice's log-likelihood from one full forward of context + continuation, no cache,
    the context left-cut to block_size + 1 tokens, as lm-eval does."""
    out = []
    for choice in item.choices:
        ctx, cont = encode_pair(tok, item.context, delimiter + choice)
        ids = (ctx + cont)[-(model.config.block_size + 1) :]
        with torch.no_grad():
            logp = F.log_softmax(model(torch.tensor([ids[:-1]]))[0].double(), -1)
        n = len(ids) - 1
        out.append(sum(float(logp[n - len(cont) + j, t]) for j, t in enumerate(cont)))
    return out


def test_continuation_is_the_tail_of_the_whole_encoding(bpe):
    """lm-eval's rule: encode context and context + continuation; the continuation's tokens
    are the whole encoding after as many tokens as the context alone has."""
    ctx, cont = encode_pair(bpe, "First Citiz", "en:")
    whole = bpe.encode("First Citizen:")
    assert ctx == bpe.encode("First Citiz")
    assert cont == whole[len(ctx) :]
    assert bpe.decode(whole) == "First Citizen:"


def test_trailing_space_of_the_context_moves_to_the_continuation(bpe):
    ctx, cont = encode_pair(bpe, "All:\nSpeak, ", " speak.")
    assert ctx == bpe.encode("All:\nSpeak,")
    assert bpe.decode(cont) == "  speak."  # the context's space, then the delimiter's


def test_byte_tokens_of_a_continuation_are_its_bytes():
    ctx, cont = encode_pair(ByteTokenizer(), "ab  ", "é")
    assert ctx == list(b"ab") and cont == list("  é".encode())


def test_empty_context_is_the_prefix_token(bpe):
    ctx, cont = encode_pair(bpe, "", " All")
    assert ctx == [bpe.special_tokens["<|endoftext|>"]] and cont == bpe.encode(" All")


@pytest.mark.parametrize("method", ["cache", "batch"])
def test_logliks_equal_an_independent_full_forward(model, bpe, method):
    scores = score_items(model, bpe, ITEMS, method=method)
    for item, s in zip(ITEMS, scores, strict=True):
        ref = reference_logliks(model, bpe, item)
        assert s.logliks == pytest.approx(ref, abs=2e-4)
        pred = max(range(len(ref)), key=lambda i: (ref[i], -i))
        norm = [r / len(c) for r, c in zip(ref, item.choices, strict=True)]
        assert s.pred == pred and s.pred_norm == max(range(len(norm)), key=lambda i: (norm[i], -i))
        assert s.lengths == tuple(len(c) for c in item.choices)


def test_items_longer_than_the_block_are_cut_from_the_left(bpe):
    small = tiny_llama(bpe.vocab_size, block=16)
    item = ChoiceItem(CORPUS_TEXT[:300], ("hear me speak.", "famish?"), 0)
    for method in ("cache", "batch"):
        (s,) = score_items(small, bpe, [item], method=method)
        assert s.logliks == pytest.approx(reference_logliks(small, bpe, item), abs=2e-4)


def test_cache_and_batch_agree_on_many_items(model, bpe):
    items = [ChoiceItem(CORPUS_TEXT[i : i + 40 + i % 30], ("speak", "die than to", "All:"), i % 3)
             for i in range(0, 600, 37)]  # fmt: skip
    a = score_items(model, bpe, items, method="cache")
    b = score_items(model, bpe, items, method="batch", max_tokens=300)  # several forwards
    for x, y in zip(a, b, strict=True):
        assert x.logliks == pytest.approx(y.logliks, abs=2e-4)


def test_acc_norm_divides_by_characters():
    s = ItemScore(logliks=(-10.0, -6.0), lengths=(10, 2), tokens=(3, 1), gold=0)
    assert s.pred == 1 and s.pred_norm == 0  # -6 > -10, but -1.0/char > -3.0/char
    assert (s.acc, s.acc_norm) == (0.0, 1.0)


def test_ties_go_to_the_first_choice():
    assert ItemScore((-1.0, -1.0, -2.0), (1, 1, 1), (1, 1, 1), 1).pred == 0


def test_standard_error_is_lm_evals_sample_stderr():
    scores = [ItemScore((0.0, -1.0), (1, 1), (1, 1), g) for g in (0, 1, 0, 0)]
    result = accuracy(scores)
    assert result["acc"] == 0.75 and result["items"] == 4
    assert result["acc_stderr"] == pytest.approx(0.25)  # sqrt(0.75 / 3) / sqrt(4)
    assert math.isnan(mean_stderr([1.0]))


def test_bad_input_is_one_clear_error(model, bpe):
    with pytest.raises(LaminaError, match="method must be one of"):
        score_items(model, bpe, ITEMS, method="fast")  # type: ignore[arg-type]
    with pytest.raises(LaminaError, match="no items"):
        accuracy([])


def test_a_choice_with_no_tokens_names_the_item(model, bpe):
    """The whole encoding is no longer than the context's (a merge across the boundary with
    an empty delimiter): lm-eval asserts; lamina names the item."""
    items = [ITEMS[0], ChoiceItem("Speak", ("", "x"), 0)]
    with pytest.raises(LaminaError, match="item 2: choice 0"):
        score_items(model, bpe, items, delimiter="")

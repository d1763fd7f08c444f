"""Perplexity (lamina.evals.perplexity): the sliding window scores every token once, equals one
full forward when the text fits, and reports per token, per character and bits per byte."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_evals_choice import tiny_llama

from lamina.errors import LaminaError
from lamina.evals.perplexity import split_loss, text_perplexity, token_nll, windows
from lamina.tokenizers.subword import ByteTokenizer

TEXT = "Speak, speak. You are all resolved rather to die than to famish? Résolu. " * 3


@pytest.fixture(scope="module")
def model():
    return tiny_llama(ByteTokenizer().vocab_size, block=64)


def full_nll(model, ids: list[int]) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([ids[:-1]]))[0].double()
    return float(F.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum"))


@pytest.mark.parametrize("n, window, stride", [(10, 4, 2), (100, 16, 5), (17, 16, 16), (2, 8, 3)])
def test_windows_score_every_token_exactly_once(n, window, stride):
    scored = []
    for start, end, first in windows(n, window, stride):
        assert end - start <= window and first >= 0
        scored += list(range(start + 1 + first, end + 1))  # the target indices it scores
    assert scored == list(range(1, n))


@pytest.mark.parametrize("stride", [1, 7, 32, 64])
def test_a_text_that_fits_is_one_full_forward(model, stride):
    ids = ByteTokenizer().encode(TEXT[:60])
    total, n = token_nll(model, ids, window=64, stride=stride)
    assert n == len(ids) - 1
    assert total == pytest.approx(full_nll(model, ids), rel=1e-5)


def test_sliding_window_gives_each_token_its_own_context(model):
    """Window 16, stride 8: the sum equals an explicit forward per window, each scoring only
    its new tokens (which see 8 to 15 tokens before them)."""
    ids = ByteTokenizer().encode(TEXT[:100])
    total, n = token_nll(model, ids, window=16, stride=8, batch_size=3)
    expected = 0.0
    for start, end, first in windows(len(ids), 16, 8):
        with torch.no_grad():
            logits = model(torch.tensor([ids[start:end]]))[0].double()
        targets = torch.tensor(ids[start + 1 : end + 1])
        expected += float(F.cross_entropy(logits[first:], targets[first:], reduction="sum"))
    assert n == len(ids) - 1 and total == pytest.approx(expected, rel=1e-5)
    shorter, _ = token_nll(model, ids, window=16, stride=16)
    assert shorter != pytest.approx(total, rel=1e-6)  # context matters: the stride is real


def test_split_loss_is_consecutive_block_windows(model):
    ids = np.array(ByteTokenizer().encode(TEXT), dtype=np.int64)
    loss, n = split_loss(model, ids, block_size=20, batch_size=4)
    expected = sum(
        full_nll(model, ids[s : s + 21].tolist()) for s in range(0, len(ids) - 1, 20)
    )  # each window predicts its next 20 tokens, the last one fewer
    assert n == len(ids) - 1 and loss == pytest.approx(expected / n, rel=1e-5)


def test_per_char_and_bits_per_byte(model):
    tok = ByteTokenizer()  # no BOS: the first byte is given, the rest scored
    res = text_perplexity(model, tok, [TEXT, "ab"], window=64)
    ids = tok.encode(TEXT)
    nats = token_nll(model, ids, window=64)[0] + full_nll(model, tok.encode("ab"))
    d = res.as_dict()
    assert res.tokens == len(ids) - 1 + 1 and res.texts == 2
    assert res.chars == len(TEXT) - 1 + 1  # "R", "é": bytes != chars
    assert res.bytes == len(TEXT.encode()) - 1 + 1 and res.bytes > res.chars
    assert d["loss"] == pytest.approx(nats / res.tokens, rel=1e-6)
    assert d["bits_per_byte"] == pytest.approx(nats / math.log(2) / res.bytes, rel=1e-6)
    assert d["loss_per_char"] == pytest.approx(nats / res.chars, rel=1e-6)
    assert [p.tokens for p in res.parts] == [len(ids) - 1, 1]


def test_bad_windows_are_refused(model):
    with pytest.raises(LaminaError, match="stride <= window"):
        token_nll(model, [1, 2, 3], window=4, stride=5)
    with pytest.raises(LaminaError, match="exceeds the model's block_size"):
        token_nll(model, [1, 2, 3], window=65)
    with pytest.raises(LaminaError, match="at least 2"):
        text_perplexity(model, ByteTokenizer(), ["a"])

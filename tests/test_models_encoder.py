"""Layer 4: the encoder and the sequence classifier (the seed encoder's checks and toy task)."""

import time

import pytest
import torch

from lamina import Encoder, EncoderConfig, LaminaError, SequenceClassifier
from lamina.training.config import TrainConfig
from lamina.training.loop import run_training
from lamina.training.session import new_session


def seed_encoder(**kw) -> Encoder:
    torch.manual_seed(0)
    return Encoder(EncoderConfig(vocab_size=32, max_len=16, dropout=0.0, **kw)).eval()


def test_seed_invariants_shapes_weights_and_masked_probability():
    """The seed's run_invariant_checks: shapes, 2 layers of (2, 4, 5, 5) weights, pads get 0."""
    enc = seed_encoder()
    ids = torch.tensor([[1, 2, 3, 4, 0], [5, 6, 7, 0, 0]])
    pad = ids.eq(0)
    hidden, weights = enc(ids, pad, return_weights=True)
    assert hidden.shape == (2, 5, 64)
    assert len(weights) == 2 and weights[0].shape == (2, 4, 5, 5)
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(2, 4, 5))
    assert (
        torch.count_nonzero(weights[0].masked_select(pad[:, None, None, :].expand_as(weights[0])))
        == 0
    )


def test_pad_row_is_zero_and_embeddings_are_scaled():
    enc = seed_encoder()
    assert enc.embed.wte.weight[0].abs().sum() == 0
    assert enc.embed.scale and enc.embed.positions == "sinusoidal"


def test_real_positions_ignore_what_pads_contain():
    """Changing the id under a pad (masked) leaves the real positions' states unchanged."""
    enc = seed_encoder()
    ids = torch.tensor([[3, 4, 5, 0, 0]])
    pad = torch.tensor([[False, False, False, True, True]])
    other = ids.clone()
    other[0, 3:] = torch.tensor([9, 11])
    torch.testing.assert_close(enc(ids, pad)[:, :3], enc(other, pad)[:, :3])


def test_pre_ln_encoder_has_a_final_norm():
    assert isinstance(seed_encoder(norm_first=True).norm_f, torch.nn.Module)
    assert type(seed_encoder(norm_first=True).norm_f).__name__ == "LayerNorm"
    assert type(seed_encoder().norm_f).__name__ == "Identity"


@pytest.mark.parametrize("pooling", ["first", "mean", "last"])
def test_classifier_pooling_ignores_right_padding(pooling):
    """Appending pads (marked as pads) does not change the class logits."""
    torch.manual_seed(0)
    clf = SequenceClassifier(
        EncoderConfig(vocab_size=32, max_len=16, dropout=0.0), pooling=pooling
    ).eval()
    ids = torch.tensor([[5, 6, 7]])
    padded = torch.tensor([[5, 6, 7, 0, 0]])
    torch.testing.assert_close(clf(ids), clf(padded), atol=1e-5, rtol=0)


def test_last_pooling_reads_the_last_real_token_not_a_pad():
    """rasbt/LLMs-from-scratch#990: with right padding the last *real* token is used."""
    torch.manual_seed(0)
    clf = SequenceClassifier(
        EncoderConfig(vocab_size=32, max_len=16, dropout=0.0), pooling="last"
    ).eval()
    a = clf(torch.tensor([[5, 6, 7, 0, 0]]))
    b = clf(torch.tensor([[5, 6, 8, 0, 0]]))
    assert (a - b).abs().max() > 1e-4


def test_classifier_rejects_bad_arguments():
    c = EncoderConfig(vocab_size=32, max_len=16)
    with pytest.raises(LaminaError, match="n_classes"):
        SequenceClassifier(c, n_classes=1)
    with pytest.raises(LaminaError, match="pooling"):
        SequenceClassifier(c, pooling="max")


def test_bad_padding_mask_is_a_value_error():
    enc = seed_encoder()
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="shape"):
        enc(ids, torch.zeros(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        enc(ids, torch.zeros(1, 3))


def test_first_last_task_reaches_95_percent_within_30_seconds():
    """The seed's toy task through the training loop: held-out accuracy >= 95% (defaults:
    vocab 64, length 12, 300 steps)."""
    start = time.perf_counter()
    session = new_session(TrainConfig(task="first-last", device="cpu"), out=None)
    result = run_training(session, quiet=True)
    elapsed = time.perf_counter() - start
    assert result.step == 300 and result.eval["accuracy"] >= 0.95, result
    assert elapsed < 30, elapsed

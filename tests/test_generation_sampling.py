"""Generation, sampling: pure functions of logits; validation; frequencies match probabilities."""

import math

import pytest
import torch

from lamina import LaminaError
from lamina.generation import check_sampling, probabilities, sample, top_k_filter, top_p_filter

# 0.999 quantiles of chi-square with df degrees of freedom (scipy.stats.chi2.ppf(0.999, df))
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}


@pytest.mark.parametrize(
    "kw, value",
    [
        ({"temperature": -0.1}, "-0.1"),
        ({"temperature": float("nan")}, "nan"),
        ({"top_k": 0}, "0"),
        ({"top_k": 2.5}, "2.5"),
        ({"top_p": 0.0}, "0.0"),
        ({"top_p": 1.5}, "1.5"),
        ({"top_p": -0.2}, "-0.2"),
    ],
)
def test_bad_settings_are_errors_naming_the_value(kw, value):
    args = {"temperature": 1.0, "top_k": None, "top_p": None, **kw}
    with pytest.raises(LaminaError, match=rf"{next(iter(kw))}.*{value}"):
        check_sampling(**args)
    with pytest.raises(LaminaError, match=value):
        sample(torch.zeros(1, 4), **args)


def test_temperature_zero_is_argmax():
    logits = torch.randn(6, 11)
    assert torch.equal(sample(logits, 0.0), logits.argmax(-1))


def test_top_k_one_is_argmax_at_any_temperature():
    logits = torch.randn(50, 11)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(sample(logits, 2.0, top_k=1, generator=g), logits.argmax(-1))


def test_same_generator_seed_gives_the_same_draws():
    logits = torch.randn(4, 30)
    a = [sample(logits, 1.0, generator=torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(a[0], a[1])


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    kept = torch.isfinite(top_k_filter(logits, 3))
    assert kept.tolist() == [[False, True, True, True, False]]
    assert torch.equal(top_k_filter(logits, 9), logits)


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    probs = torch.tensor([[0.1, 0.5, 0.25, 0.15]])
    logits = probs.log()
    assert torch.isfinite(top_p_filter(logits, 0.5)).tolist() == [[False, True, False, False]]
    assert torch.isfinite(top_p_filter(logits, 0.7)).tolist() == [[False, True, True, False]]
    assert torch.isfinite(top_p_filter(logits, 0.76)).tolist() == [[False, True, True, True]]
    assert torch.isfinite(top_p_filter(logits, 1e-6)).sum() == 1  # the top token always stays


def test_probabilities_are_zero_exactly_where_filtered_and_sum_to_one():
    logits = torch.randn(3, 20)
    p = probabilities(logits, 0.8, top_k=5, top_p=0.9)
    assert ((p > 0).sum(-1) <= 5).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(3))


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, None, None), (0.7, None, None), (1.3, 4, None), (1.0, None, 0.8), (0.9, 5, 0.9)],
)
def test_sampled_frequencies_match_the_filtered_softmax(temperature, top_k, top_p):
    """Chi-square goodness of fit on a vocabulary of 7 (seeded: the test is not flaky)."""
    logits = torch.tensor([[1.2, 0.3, -0.5, 2.0, 0.0, -1.5, 0.9]])
    n = 20_000
    g = torch.Generator().manual_seed(1234)
    draws = sample(logits.expand(n, -1), temperature, top_k, top_p, generator=g)
    counts = torch.bincount(draws, minlength=7).double()
    p = probabilities(logits, temperature, top_k, top_p)[0].double()
    assert (counts[p == 0] == 0).all(), "a filtered token was drawn"
    support = p > 0
    expected = n * p[support]
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    df = int(support.sum()) - 1
    assert df >= 1
    assert chi2 < CHI2_999[df], f"chi2 {chi2:.2f} with {df} degrees of freedom"


def test_chi_square_detects_a_wrong_temperature():
    """The goodness-of-fit test above has power: temperature 1 draws fail against 0.5."""
    logits = torch.tensor([[1.2, 0.3, -0.5, 2.0, 0.0, -1.5, 0.9]])
    n = 20_000
    draws = sample(logits.expand(n, -1), 1.0, generator=torch.Generator().manual_seed(1234))
    counts = torch.bincount(draws, minlength=7).double()
    expected = n * probabilities(logits, 0.5)[0].double()
    assert float(((counts - expected) ** 2 / expected).sum()) > CHI2_999[6]


def test_logits_must_be_two_dimensional():
    with pytest.raises(LaminaError, match=r"\(B, V\)"):
        sample(torch.zeros(4), 1.0)


def test_sampling_bf16_logits_works():
    logits = torch.randn(2, 9).bfloat16()
    out = sample(logits, 0.8, top_k=3, top_p=0.9, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2,) and out.dtype == torch.long
    assert not math.isnan(float(out.sum()))

"""Specification of lamina.data.toy_tasks: first-last, copy and reverse synthetic tasks."""

from __future__ import annotations

import pytest
import torch

from lamina.data import IGNORE_INDEX, SEP_ID, TOY_TASKS, copy_batch, first_last_batch, reverse_batch
from lamina.errors import LaminaError


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("batch_size", [1, 2, 7, 64])
def test_first_last_labels_are_balanced(batch_size):
    """Exactly ceil(B/2) positives and floor(B/2) negatives."""
    _, labels = first_last_batch(batch_size, generator=gen())
    assert labels.dtype == torch.int64 and labels.shape == (batch_size,)
    assert int(labels.sum()) == (batch_size + 1) // 2
    assert set(labels.tolist()) <= {0, 1}


@pytest.mark.parametrize("vocab_size", [3, 4, 64])
def test_first_last_labels_match_first_and_last_tokens(vocab_size):
    """Label 1 iff last == first; ids lie in 1..V-1 (0 is padding)."""
    ids, labels = first_last_batch(256, length=5, vocab_size=vocab_size, generator=gen(1))
    assert ids.dtype == torch.int64 and ids.shape == (256, 5)
    assert int(ids.min()) >= 1 and int(ids.max()) <= vocab_size - 1
    same = ids[:, -1] == ids[:, 0]
    assert torch.equal(same, labels == 1)


def test_first_last_labels_are_shuffled():
    """Positives are not all at the front."""
    _, labels = first_last_batch(64, generator=gen(2))
    assert labels[:32].sum() != 32


@pytest.mark.parametrize(("fn", "reverse"), [(copy_batch, False), (reverse_batch, True)])
def test_copy_and_reverse_targets_and_ignore_index(fn, reverse):
    """x = src SEP tgt[:-1]; y scores only the L target tokens, -100 elsewhere."""
    length, vocab = 6, 10
    x, y = fn(32, length, vocab, generator=gen(3))
    assert x.shape == y.shape == (32, 2 * length)
    assert x.dtype == y.dtype == torch.int64
    src = x[:, :length]
    assert int(src.min()) >= 2 and int(src.max()) <= vocab - 1
    assert (x[:, length] == SEP_ID).all()
    expected = src.flip(1) if reverse else src
    assert torch.equal(y[:, length:], expected)
    assert (y[:, :length] == IGNORE_INDEX).all()
    assert torch.equal(x[:, length + 1 :], expected[:, :-1])


@pytest.mark.parametrize("name", sorted(TOY_TASKS))
def test_tasks_are_deterministic_given_a_seeded_generator(name):
    """The same seed gives the same batch; another seed gives another."""
    fn = TOY_TASKS[name]
    a, b, c = fn(16, generator=gen(7)), fn(16, generator=gen(7)), fn(16, generator=gen(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_tasks_registry_names():
    """TOY_TASKS maps the three task names to their functions."""
    expected = {"first-last": first_last_batch, "copy": copy_batch, "reverse": reverse_batch}
    assert expected == TOY_TASKS


@pytest.mark.parametrize(
    ("fn", "kwargs", "field"),
    [
        (first_last_batch, {"batch_size": 0}, "batch_size"),
        (first_last_batch, {"batch_size": 4, "length": 1}, "length"),
        (first_last_batch, {"batch_size": 4, "vocab_size": 2}, "vocab_size"),
        (copy_batch, {"batch_size": 4, "length": 3, "vocab_size": 3}, "vocab_size"),
        (reverse_batch, {"batch_size": 4, "length": 0, "vocab_size": 8}, "length"),
        (copy_batch, {"batch_size": 2.0, "length": 3, "vocab_size": 8}, "batch_size"),
        (copy_batch, {"batch_size": 2, "generator": 5}, "generator"),
    ],
)
def test_bad_arguments_raise_lamina_error(fn, kwargs, field):
    """Out-of-range or mistyped arguments raise LaminaError naming the field."""
    with pytest.raises(LaminaError, match=field):
        fn(**kwargs)

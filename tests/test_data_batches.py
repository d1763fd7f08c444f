"""Specification of lamina.data.batches: window sampling, reproducibility, resumption."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lamina.data import WindowSampler, fixed_batches
from lamina.errors import LaminaError

TOKENS = (np.arange(5000) * 7919 % 251).astype(np.uint8)


def test_sample_shapes_and_dtype():
    """sample gives two int64 (batch_size, block_size) tensors."""
    x, y = WindowSampler(TOKENS, block_size=16, seed=0).sample(4)
    assert x.shape == y.shape == (4, 16)
    assert x.dtype == y.dtype == torch.int64


def test_y_is_x_shifted_by_one_in_the_underlying_tokens():
    """Each row of x is tokens[s:s+T] and the row of y is tokens[s+1:s+T+1]."""
    sampler = WindowSampler(TOKENS, block_size=8, seed=3)
    starts = sampler.starts(5)
    x, y = sampler.windows(starts)
    for row, s in enumerate(starts):
        assert x[row].tolist() == TOKENS[s : s + 8].tolist()
        assert y[row].tolist() == TOKENS[s + 1 : s + 9].tolist()


def test_sample_equals_windows_of_starts_from_same_stream():
    """sample(B) is windows(starts(B)) drawn from the same generator."""
    a, b = WindowSampler(TOKENS, 8, seed=5), WindowSampler(TOKENS, 8, seed=5)
    xa, ya = a.sample(3)
    xb, yb = b.windows(b.starts(3))
    assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_x_and_y_do_not_share_memory():
    """Editing y in place (e.g. masking) leaves x unchanged."""
    x, y = WindowSampler(TOKENS, 8, seed=0).sample(2)
    before = x.clone()
    y.fill_(-100)
    assert torch.equal(x, before)


def test_same_seed_same_batches_different_seed_different():
    """The stream depends on the seed and on nothing else."""
    a = [WindowSampler(TOKENS, 8, seed=1).sample(4) for _ in range(2)]
    c = WindowSampler(TOKENS, 8, seed=2).sample(4)
    assert torch.equal(a[0][0], a[1][0]) and torch.equal(a[0][1], a[1][1])
    assert not torch.equal(a[0][0], c[0])


def test_state_dict_resume_continues_identical_stream():
    """Draw 3, save, draw 2 == a fresh sampler restored after 3 draws, then draw 2."""
    original = WindowSampler(TOKENS, 8, seed=11)
    for _ in range(3):
        original.sample(4)
    state = json.loads(json.dumps(original.state_dict()))
    assert state["batches_drawn"] == 3
    expected = [original.sample(4) for _ in range(2)]

    resumed = WindowSampler(TOKENS, 8, seed=999)
    resumed.load_state_dict(state)
    got = [resumed.sample(4) for _ in range(2)]
    for (xe, ye), (xg, yg) in zip(expected, got, strict=True):
        assert torch.equal(xe, xg) and torch.equal(ye, yg)
    assert resumed.batches_drawn == 5


def test_load_state_dict_refuses_state_of_other_split():
    """A state saved for another block size is refused, naming the field."""
    state = WindowSampler(TOKENS, 8).state_dict()
    with pytest.raises(LaminaError, match="block_size"):
        WindowSampler(TOKENS, 16).load_state_dict(state)


def test_refuses_split_shorter_than_block_size_plus_one():
    """A split of N <= block_size tokens is refused with N, block_size and block_size + 1."""
    with pytest.raises(LaminaError) as e:
        WindowSampler(np.zeros(8, dtype=np.uint8), block_size=8)
    msg = str(e.value)
    assert "8 tokens" in msg and "block_size=8" in msg and "at least 9" in msg


def test_only_start_is_zero_when_tokens_are_block_size_plus_one():
    """With exactly block_size + 1 tokens every window starts at 0 and never reads past the end."""
    tokens = np.arange(9, dtype=np.uint8)
    sampler = WindowSampler(tokens, block_size=8, seed=0)
    assert set(sampler.starts(200).tolist()) == {0}
    x, y = sampler.sample(3)
    assert x[0].tolist() == list(range(8)) and y[0].tolist() == list(range(1, 9))


def test_starts_cover_the_whole_valid_range():
    """Starts fall in [0, N - T - 1] and reach both ends."""
    tokens = np.arange(12, dtype=np.uint8)
    starts = WindowSampler(tokens, block_size=8, seed=0).starts(2000)
    assert starts.min() == 0 and starts.max() == 3


def test_windows_rejects_out_of_range_starts():
    """A start that would read past the end is refused."""
    sampler = WindowSampler(np.arange(12, dtype=np.uint8), block_size=8)
    with pytest.raises(LaminaError, match="starts"):
        sampler.windows(np.array([0, 4]))


@pytest.mark.parametrize(("block_size", "batch_size"), [(0, 1), (8, 0), (2.5, 1)])
def test_bad_sizes_raise(block_size, batch_size):
    """block_size and batch_size must be positive integers."""
    with pytest.raises(LaminaError):
        WindowSampler(TOKENS, block_size).sample(batch_size)


def test_fixed_batches_identical_across_calls():
    """fixed_batches returns the same windows on every call."""
    a = fixed_batches(TOKENS, block_size=8, batch_size=4, n_batches=3)
    b = fixed_batches(TOKENS, block_size=8, batch_size=4, n_batches=3)
    assert len(a) == 3
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(a[0][0], a[1][0])

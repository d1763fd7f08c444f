"""Layer 1: token + position embedding, tying, position offset (the seed's layer_1 self-test)."""

import pytest
import torch
from torch import nn

from lamina.embedding import Embedding, sinusoidal_table
from lamina.errors import LaminaError


def make(**kw):
    torch.manual_seed(0)
    args = dict(vocab_size=109, block_size=64, d_model=32)
    args.update(kw)
    return Embedding(**args).eval()


def test_output_shape_is_batch_time_width():
    """ids (B, T) -> (B, T, d_model)."""
    emb = make()
    assert emb(torch.randint(0, 109, (4, 16))).shape == (4, 16, 32)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_token_part_is_constant_across_positions(positions):
    """The same id at every position differs from position to position only by the position part."""
    emb = make(positions=positions)
    x = emb(torch.full((1, 16), 42))
    pos = emb.position_vectors(torch.arange(16))
    token_part = x[0] - pos
    torch.testing.assert_close(token_part, token_part[:1].expand_as(token_part), atol=1e-6, rtol=0)


def test_position_part_is_constant_across_tokens():
    """At one position, different ids differ only by their token vectors."""
    emb = make()
    ids = torch.randint(0, 109, (4, 8))
    x = emb(ids)
    pos_part = x[:, 0] - emb.wte(ids[:, 0])
    torch.testing.assert_close(pos_part, pos_part[:1].expand_as(pos_part), atol=1e-6, rtol=0)


def test_gradients_reach_both_tables():
    """Backprop through the sum reaches the token and the position table."""
    emb = make().train()
    emb(torch.randint(0, 109, (2, 8))).sum().backward()
    assert emb.wte.weight.grad.abs().sum() > 0
    assert emb.wpe.weight.grad.abs().sum() > 0


def test_parameter_count_comes_from_the_config():
    """vocab * d + block * d for learned positions; sinusoidal positions add no parameters."""
    emb = Embedding(109, 1024, 512)
    assert sum(p.numel() for p in emb.parameters()) == 109 * 512 + 1024 * 512 == 580_096
    sin = Embedding(109, 1024, 512, positions="sinusoidal")
    assert sum(p.numel() for p in sin.parameters()) == 109 * 512


def test_tie_lm_head_shares_storage_not_a_copy():
    """After tying, the head's weight is the token table itself."""
    emb = make()
    head = emb.tie_lm_head(nn.Linear(32, 109, bias=False))
    assert head.weight is emb.wte.weight
    assert head.weight.data_ptr() == emb.wte.weight.data_ptr()
    with torch.no_grad():
        emb.wte.weight[3, 0] = 123.0
    assert head.weight[3, 0] == 123.0


def test_tie_refuses_a_head_of_the_wrong_shape():
    with pytest.raises(LaminaError, match="cannot tie"):
        make().tie_lm_head(nn.Linear(32, 10, bias=False))


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_pos_offset_continues_the_stream(positions):
    """Embedding a suffix with pos_offset=k equals the suffix of embedding the whole sequence."""
    emb = make(positions=positions)
    ids = torch.randint(0, 109, (2, 20))
    torch.testing.assert_close(emb(ids[:, 7:], pos_offset=7), emb(ids)[:, 7:])


def test_explicit_positions_override_the_offset():
    """Per-row positions (left padding) pick rows of the position table directly."""
    emb = make()
    ids = torch.randint(0, 109, (2, 5))
    pos = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]])
    x = emb(ids, positions=pos)
    torch.testing.assert_close(x[1], emb(ids[1:])[0])
    torch.testing.assert_close(x[0, 2:], emb(ids[:1, 2:])[0])


def test_block_size_overflow_is_a_value_error():
    """pos_offset + T > block_size raises ValueError naming the numbers."""
    emb = make()
    with pytest.raises(ValueError, match="exceeds block_size 64"):
        emb(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="60 \\+ 5 = 65"):
        emb(torch.zeros(1, 5, dtype=torch.long), pos_offset=60)
    emb(torch.zeros(1, 4, dtype=torch.long), pos_offset=60)  # exactly fits


@pytest.mark.parametrize(
    "ids, message",
    [
        (torch.tensor([[1, 109]]), "token id 109 is outside"),
        (torch.tensor([[-1, 2]]), "token id -1 is outside"),
        (torch.tensor([[1.0, 2.0]]), "integer tensor"),
        (torch.tensor([1, 2]), "shape \\(B, T\\)"),
    ],
)
def test_bad_ids_raise_value_error(ids, message):
    with pytest.raises(ValueError, match=message):
        make()(ids)


def test_dropout_only_in_training_mode():
    """Eval mode is deterministic; training mode with dropout is not."""
    emb = make(dropout=0.5)
    ids = torch.randint(0, 109, (2, 8))
    assert torch.equal(emb(ids), emb(ids))
    emb.train()
    assert not torch.equal(emb(ids), emb(ids))


def test_padding_row_is_zero_and_scaling_multiplies_tokens():
    """padding_idx keeps a zero row; scale multiplies token vectors by sqrt(d)."""
    emb = make(padding_idx=0, scale=True, positions="sinusoidal")
    assert emb.wte.weight[0].abs().sum() == 0
    x = emb(torch.tensor([[5]]))
    torch.testing.assert_close(x[0, 0], emb.wte.weight[5] * 32**0.5 + sinusoidal_table(64, 32)[0])


def test_sinusoidal_table_matches_the_paper_formula():
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...)."""
    t = sinusoidal_table(50, 16)
    p, i = 17, 3
    angle = torch.tensor(p / 10000 ** (2 * i / 16))
    torch.testing.assert_close(t[p, 2 * i], torch.sin(angle))
    torch.testing.assert_close(t[p, 2 * i + 1], torch.cos(angle))


@pytest.mark.parametrize("field", ["vocab_size", "block_size", "d_model"])
def test_non_positive_sizes_are_rejected(field):
    args = dict(vocab_size=10, block_size=10, d_model=8)
    args[field] = 0
    with pytest.raises(ValueError, match=field):
        Embedding(**args)


def test_no_position_table_gives_token_vectors_and_still_checks_positions():
    emb = Embedding(50, 8, 16, positions="none")
    ids = torch.randint(0, 50, (2, 5))
    torch.testing.assert_close(emb(ids, pos_offset=3), emb.wte(ids))
    assert sum(p.numel() for p in emb.parameters()) == 50 * 16
    with pytest.raises(LaminaError, match="exceeds block_size 8"):
        emb(ids, pos_offset=4)
    assert emb.positions_for(5, 3).tolist() == [3, 4, 5, 6, 7]

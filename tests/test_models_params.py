"""Parameter counts: formula == built model for a grid of configs; GPT-2 small on meta."""

import itertools

import pytest
import torch

from lamina import GPT, Encoder, EncoderConfig, GPTConfig, count_params
from lamina.models.params import count_module_params, gpt_param_table, meta_model


@pytest.mark.parametrize(
    "tie, qkv_bias, bias, norm_first, positions, d_ff",
    list(
        itertools.product(
            [True, False],
            [True, False],
            [True, False],
            [True, False],
            ["learned", "sinusoidal"],
            [None, 40],
        )
    ),
)
def test_formula_equals_built_model(tie, qkv_bias, bias, norm_first, positions, d_ff):
    c = GPTConfig(
        vocab_size=37,
        block_size=11,
        d_model=16,
        n_heads=4,
        n_layers=3,
        tie_weights=tie,
        qkv_bias=qkv_bias,
        bias=bias,
        norm_first=norm_first,
        positions=positions,
        d_ff=d_ff,
    )
    with torch.device("meta"):
        model = GPT(c)
    assert count_module_params(model) == count_params(c)


def test_tied_argument_overrides_the_config():
    c = GPTConfig.preset("tiny")
    assert count_params(c, tied=False) - count_params(c, tied=True) == 100 * 32


def test_gpt2_small_as_hugging_face_ships_it():
    """124,439,808 tied and 163,037,184 untied, built on the meta device."""
    c = GPTConfig.preset("gpt2-small")
    model = meta_model(c)
    assert next(model.parameters()).device.type == "meta"
    assert count_module_params(model) == count_params(c) == 124_439_808
    assert count_module_params(meta_model(c.replace(tie_weights=False))) == 163_037_184


def test_gpt2_small_without_qkv_bias_as_in_the_seed_notebook():
    c = GPTConfig.preset("gpt2-small", qkv_bias=False)
    assert count_module_params(meta_model(c)) == 124_412_160
    assert count_module_params(meta_model(c.replace(tie_weights=False))) == 163_009_536


def test_table_components_sum_to_the_total():
    c = GPTConfig.preset("gpt2-small")
    table = gpt_param_table(c)
    assert table["token embedding"] == 50257 * 768 and table["head"] == 0
    assert sum(table.values()) == count_params(c)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_formula_equals_built_encoder(norm_first):
    c = EncoderConfig(vocab_size=64, max_len=12, norm_first=norm_first, n_layers=3, d_ff=96)
    assert count_module_params(Encoder(c)) == count_params(c)

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


@pytest.mark.parametrize(
    "positions, norm, gain, activation, n_kv_heads, qk_norm, bias, qkv_bias",
    list(
        itertools.product(
            ["learned", "rope"],
            ["layer", "rms"],
            [True, False],
            ["relu2", "swiglu"],
            [None, 1, 2],
            [False, True],
            [True, False],
            [True, False],
        )
    ),
)
def test_formula_equals_built_model_for_every_layer_option(
    positions, norm, gain, activation, n_kv_heads, qk_norm, bias, qkv_bias
):
    c = GPTConfig(
        vocab_size=37,
        block_size=11,
        d_model=16,
        n_heads=4,
        n_layers=2,
        positions=positions,
        norm=norm,
        norm_gain=gain,
        activation=activation,
        n_kv_heads=n_kv_heads,
        qk_norm=qk_norm,
        bias=bias,
        qkv_bias=qkv_bias,
        d_ff=24,
        tie_weights=False,
        logit_softcap=5.0,
        zero_init_proj=True,
    )
    model = meta_model(c)
    assert count_module_params(model) == count_params(c)
    assert sum(gpt_param_table(c).values()) == count_params(c)


@pytest.mark.parametrize(
    "sandwich, activation, norm, gain, qk_norm",
    list(
        itertools.product(
            [False, True], ["geglu", "gelu"], ["rms", "layer"], [True, False], [False, True]
        )
    ),
)
def test_formula_equals_built_model_with_gemma_phi_and_mistral_options(
    sandwich, activation, norm, gain, qk_norm
):
    c = GPTConfig(
        vocab_size=37,
        block_size=11,
        d_model=16,
        n_heads=4,
        n_layers=3,
        positions="rope",
        norm=norm,
        norm_gain=gain,
        qk_norm=qk_norm,
        activation=activation,
        d_ff=24,
        sandwich_norm=sandwich,
        norm_offset=1.0 if norm == "rms" else 0.0,
        sliding_window=4,
        layer_types=("sliding", "full", "sliding"),
        rope_local_theta=10.0,
        attn_softcap=5.0,
        attn_scale=0.5,
        embed_scale=4.0,
        rotary_dim=2,
    )
    assert count_module_params(meta_model(c)) == count_params(c)


def test_smollm_135m_is_its_published_count_and_hugging_face_agrees():
    """134,515,008: SmolLM-135M's parameters (tied head), also counted by transformers."""
    transformers = pytest.importorskip("transformers")
    c = GPTConfig.preset("smollm-135m")
    assert count_module_params(meta_model(c)) == count_params(c) == 134_515_008
    hf = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
        tie_word_embeddings=True,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(hf)
    assert model.num_parameters() == count_params(c)


def test_llama_tiny_counts_and_builds():
    c = GPTConfig.preset("llama-tiny")
    table = gpt_param_table(c)
    assert table["position embedding"] == 0 and table["head"] == 65 * 128
    assert count_module_params(GPT(c)) == count_params(c)


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

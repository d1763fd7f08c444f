"""Layer 4 configs: presets, validation naming the field, JSON round trips."""

import json

import pytest

from lamina import EncoderConfig, GPTConfig, LaminaError


def test_presets_have_the_documented_shapes():
    c = GPTConfig.preset("char-cpu")
    assert (c.n_layers, c.n_heads, c.d_model, c.block_size) == (4, 4, 128, 64)
    b = GPTConfig.preset("baby")
    assert (b.n_layers, b.n_heads, b.d_model, b.block_size, b.dropout) == (6, 6, 384, 256, 0.2)
    g = GPTConfig.preset("gpt2-small")
    assert (g.vocab_size, g.block_size, g.d_model, g.n_heads, g.n_layers) == (
        50257,
        1024,
        768,
        12,
        12,
    )
    assert g.qkv_bias and g.tie_weights


def test_preset_overrides_and_unknown_names():
    assert GPTConfig.preset("tiny", n_layers=5).n_layers == 5
    with pytest.raises(LaminaError, match="unknown preset 'huge'"):
        GPTConfig.preset("huge")
    with pytest.raises(LaminaError, match="unknown GPTConfig field"):
        GPTConfig.preset("tiny", n_layer=5)


def test_json_round_trip():
    c = GPTConfig.preset("baby", vocab_size=77, tie_weights=False)
    assert GPTConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    e = EncoderConfig(vocab_size=64, max_len=12, norm_first=True)
    assert EncoderConfig.from_dict(json.loads(json.dumps(e.to_dict()))) == e


def test_missing_fields_take_defaults_and_unknown_fields_are_named():
    c = GPTConfig.from_dict(dict(vocab_size=10, block_size=8, d_model=8, n_heads=2, n_layers=1))
    assert c.qkv_bias is True and c.dropout == 0.0
    with pytest.raises(LaminaError, match="wat"):
        GPTConfig.from_dict(
            dict(vocab_size=10, block_size=8, d_model=8, n_heads=2, n_layers=1, wat=1)
        )


BASE = dict(vocab_size=10, block_size=8, d_model=8, n_heads=2, n_layers=1)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(d_model=10, n_heads=4), "d_model=10 must be divisible by n_heads=4"),
        (dict(vocab_size=0), "vocab_size must be a positive integer, got 0"),
        (dict(n_layers=-1), "n_layers must be a positive integer, got -1"),
        (dict(block_size=2.5), "block_size"),
        (dict(dropout=1.0), "dropout must be in \\[0, 1\\), got 1.0"),
        (dict(dropout=-0.1), "dropout"),
        (dict(activation="swish"), "activation"),
        (dict(positions="rotary"), "positions"),
        (dict(tie_weights="yes"), "tie_weights"),
        (dict(d_ff=0), "d_ff"),
        (dict(d_model=8, n_heads=4, n_kv_heads=3), "n_heads=4 must be divisible by n_kv_heads=3"),
        (dict(n_kv_heads=0), "n_kv_heads must be a positive integer, got 0"),
        (dict(d_model=12, n_heads=4, positions="rope"), "even head dimension.*= 3"),
        (dict(positions="rope", rope_theta=0.0), "rope_theta must be a positive number, got 0.0"),
        (dict(rope_theta=-1), "rope_theta must be a positive number, got -1"),
        (dict(logit_softcap=0.0), "logit_softcap must be a positive number, got 0.0"),
        (dict(logit_softcap=-3.0), "logit_softcap must be a positive number, got -3.0"),
        (dict(activation="swiglu", d_ff=0), "d_ff must be a positive integer, got 0"),
        (dict(activation="swiglu", d_ff=-8), "d_ff must be a positive integer, got -8"),
        (dict(norm="batch"), "norm must be one of 'layer', 'rms', got 'batch'"),
        (dict(qk_norm="yes"), "qk_norm must be true or false"),
        (dict(norm_gain=1), "norm_gain"),
        (dict(zero_init_proj=None), "zero_init_proj"),
    ],
)
def test_bad_gpt_config_names_field_and_value(change, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{**BASE, **change})


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(d_model=30), "divisible"),
        (dict(pad_id=64), "pad_id"),
        (dict(dropout=2), "dropout"),
        (dict(max_len=0), "max_len"),
    ],
)
def test_bad_encoder_config_names_field(change, message):
    with pytest.raises(ValueError, match=message):
        EncoderConfig(**{**dict(vocab_size=64, max_len=12), **change})

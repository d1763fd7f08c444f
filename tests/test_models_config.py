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
        (dict(attn_dropout=1.0), "attn_dropout must be in \\[0, 1\\), got 1.0"),
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


ROPE = dict(BASE, d_model=16, n_heads=2, n_layers=2, positions="rope", norm="rms")
LONGROPE = dict(kind="longrope", factor=32.0, original_max_positions=16)


def test_layer_options_round_trip_through_json_and_old_configs_keep_todays_layers():
    c = GPTConfig(
        **ROPE,
        sliding_window=4,
        layer_types=["sliding", "full"],  # a JSON list becomes a tuple
        rope_local_theta=10.0,
        attn_softcap=50.0,
        attn_scale=0.25,
        embed_scale=4.0,
        norm_offset=1.0,
        sandwich_norm=True,
        activation="geglu",
        rotary_dim=4,
        rope_scaling=dict(LONGROPE, short_factor=[1, 2], long_factor=[3.0, 4.0]),
    )
    assert c.layer_types == ("sliding", "full") and c.attention_kinds == ("sliding", "full")
    assert c.rope_scaling.short_factor == (1.0, 2.0) and c.rope_dim == 4 and c.gated
    assert GPTConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    old = GPTConfig.from_dict(dict(ROPE))  # a checkpoint saved before these fields existed
    assert (old.sliding_window, old.layer_types, old.norm_offset, old.sandwich_norm) == (
        None,
        None,
        0.0,
        False,
    )
    assert old.attention_kinds == ("full", "full") and old.rope_dim == 8
    assert GPTConfig(**ROPE, sliding_window=3).attention_kinds == ("sliding", "sliding")


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(sliding_window=0), "sliding_window must be a positive integer, got 0"),
        (dict(layer_types=("full",)), "layer_types has 1 entries for n_layers=2"),
        (dict(layer_types=("full", "local")), "layer_types entry must be one of"),
        (dict(layer_types="full"), "layer_types must be a list"),
        (dict(layer_types=("full", "sliding")), "'sliding' layers but sliding_window is null"),
        (dict(rope_local_theta=0), "rope_local_theta must be a positive number, got 0"),
        (dict(positions="learned", rope_local_theta=1e4), "rope_local_theta needs positions"),
        (dict(positions="learned", rotary_dim=4), "rotary_dim needs positions='rope'"),
        (dict(rotary_dim=3), "rotary_dim must be even and at most head_dim=8, got 3"),
        (dict(rotary_dim=10), "rotary_dim must be even and at most head_dim=8, got 10"),
        (dict(attn_softcap=-1.0), "attn_softcap must be a positive number, got -1.0"),
        (dict(attn_scale=0), "attn_scale must be a positive number, got 0"),
        (dict(embed_scale=float("inf")), "embed_scale must be a positive number"),
        (dict(norm_offset="1"), "norm_offset must be a number, got '1'"),
        (dict(norm="layer", norm_offset=1.0), "norm_offset needs norm='rms'"),
        (dict(sandwich_norm=1), "sandwich_norm must be true or false"),
        (dict(norm_first=False, sandwich_norm=True), "sandwich_norm needs pre-LN"),
        (dict(activation="gegelu"), "activation must be one of"),
        (dict(rope_scaling=dict(LONGROPE)), "kind 'longrope' needs short_factor"),
        (
            dict(rope_scaling=dict(LONGROPE, short_factor=[1] * 4, long_factor=[1] * 3)),
            "short_factor \\(4\\) and long_factor \\(3\\) must have the same length",
        ),
        (
            dict(rope_scaling=dict(LONGROPE, short_factor=[1] * 3, long_factor=[1] * 3)),
            "longrope factors number 3; a rotated width of 8 needs 4",
        ),
        (
            dict(rope_scaling=dict(LONGROPE, short_factor=[1, 0, 1, 1], long_factor=[1] * 4)),
            "short_factor must be positive numbers",
        ),
        (
            dict(rope_scaling=dict(kind="linear", factor=2.0, long_factor=[1.0])),
            "long_factor belongs to kind 'longrope' only",
        ),
        (
            dict(rope_scaling=dict(kind="linear", factor=2.0, attention_factor=1.0)),
            "attention_factor belongs to kind 'longrope' only",
        ),
    ],
)
def test_bad_layer_options_name_field_and_value(change, message):
    with pytest.raises(LaminaError, match=message):
        GPTConfig(**{**ROPE, **change})

"""Issue 35, class 7: a Hugging Face config.json and a PEFT adapter_config.json are read through
typed shapes: no string is read as a boolean or a number, sizes are bounded before anything is
allocated, and conflicting fields are refused by name."""

from __future__ import annotations

import json
import math

import pytest
import torch

import lamina
from lamina import GPT, GPTConfig, LaminaError
from lamina.interop.adapters import import_peft


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf") / "llama"
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("llama-tiny", vocab_size=16, d_model=32, n_layers=1, d_ff=64))
    lamina.save_hf(model, d)
    return d, json.loads((d / "config.json").read_text())


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("tie_word_embeddings", "false", r"tie_word_embeddings: expected true or false, got a str"),
        ("vocab_size", 1e20, r"vocab_size: expected an integer >= 1 and <= 16777216, got float"),
        ("vocab_size", 10**20, r"vocab_size: expected an integer .* got int 100000000000000000000"),
        ("hidden_size", "32", r"hidden_size: expected an integer"),
        ("rms_norm_eps", "1e-5", r"rms_norm_eps: expected a finite number"),
        ("rms_norm_eps", math.inf, r"rms_norm_eps: expected a finite number"),
        ("attention_bias", 0, r"attention_bias: expected true or false"),
        ("rope_scaling", {"rope_type": "linear", "factor": 2.0}, "rope_scaling .* rope_parameters"),
        ("rope_scaling", {"rope_type": "linear", "factor": "2"}, r"rope_scaling.factor: expected"),
    ],
)
def test_a_config_field_of_the_wrong_type_or_size_is_refused_by_name(
    hf, tmp_path, field, value, match
):
    d, config = hf
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in d.iterdir():
        (bad / f.name).symlink_to(f)
    (bad / "config.json").unlink()
    (bad / "config.json").write_text(json.dumps({**config, field: value}))  # json: Infinity
    with pytest.raises(LaminaError, match=match) as e:
        lamina.open(bad)
    assert str(bad / "config.json") in str(e.value)


def test_the_config_as_saved_still_opens(hf):
    d, config = hf
    assert "rope_parameters" in config and lamina.open(d).model.config.vocab_size == 16


def test_an_infinite_norm_epsilon_is_refused_like_nan():
    for eps in (math.inf, math.nan):
        with pytest.raises(LaminaError, match="layer_norm_eps"):
            GPTConfig.preset("tiny", vocab_size=8, layer_norm_eps=eps)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("target_modules", [{"a": 1}], r"target_modules\[0\]: expected a non-empty string"),
        ("r", "8", r"r: expected an integer"),
        ("use_dora", "false", r"use_dora: expected true or false"),
    ],
)
def test_a_peft_config_field_of_the_wrong_type_is_refused(tmp_path, field, value, match):
    config = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}
    (tmp_path / "adapter_config.json").write_text(json.dumps({**config, field: value}))
    model = GPT(GPTConfig.preset("llama-tiny", vocab_size=16, d_model=32, n_layers=1, d_ff=64))
    with pytest.raises(LaminaError, match=match):
        import_peft(model, tmp_path)

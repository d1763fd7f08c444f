"""Model directories: safetensors + JSON, tied weights once, strict loading, no pickle."""

import json

import pytest
import torch
from safetensors.torch import load_file

import lamina
from lamina import GPT, GPTConfig, LaminaError
from lamina.checkpoint import load_state, model_tensors, save_model, strip_compiled_prefix
from lamina.data import CharTokenizer


def test_round_trip_gives_identical_logits_and_tokenizer(tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny")).eval()
    tok = CharTokenizer.from_text("hello world")
    save_model(tmp_path, model, tok)
    loaded, tok2 = lamina.load(tmp_path)
    ids = torch.randint(0, 100, (2, 7))
    assert torch.equal(model(ids), loaded(ids))
    assert tok2 == tok
    assert loaded.head.weight is loaded.embed.wte.weight


def test_tied_weight_is_stored_once(tmp_path):
    save_model(tmp_path, GPT(GPTConfig.preset("tiny")))
    keys = load_file(tmp_path / "model.safetensors").keys()
    assert "embed.wte.weight" in keys and "head.weight" not in keys
    save_model(tmp_path / "u", GPT(GPTConfig.preset("tiny", tie_weights=False)))
    assert "head.weight" in load_file(tmp_path / "u" / "model.safetensors").keys()


def test_config_json_records_kind_format_and_fields(tmp_path):
    save_model(tmp_path, GPT(GPTConfig.preset("tiny")))
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["kind"] == "gpt" and data["format"] == 1 and data["model"]["d_model"] == 32


def test_compiled_prefix_is_stripped():
    state = {"_orig_mod.embed.wte.weight": torch.zeros(1), "blocks.0._orig_mod.x": torch.zeros(1)}
    assert set(strip_compiled_prefix(state)) == {"embed.wte.weight", "blocks.0.x"}
    model = GPT(GPTConfig.preset("tiny"))
    prefixed = {f"_orig_mod.{k}": v for k, v in model_tensors(model).items()}
    load_state(GPT(GPTConfig.preset("tiny")), prefixed)


def test_strict_loading_names_missing_unexpected_and_misshapen_keys():
    model = GPT(GPTConfig.preset("tiny"))
    state = model_tensors(model)
    with pytest.raises(LaminaError, match="missing keys: norm_f.bias"):
        load_state(model, {k: v for k, v in state.items() if k != "norm_f.bias"})
    with pytest.raises(LaminaError, match="unexpected keys: extra"):
        load_state(model, {**state, "extra": torch.zeros(1)})
    bad = dict(state)
    bad["norm_f.bias"] = torch.zeros(5)
    with pytest.raises(
        LaminaError, match=r"norm_f.bias has shape \(5,\), the model expects \(32,\)"
    ):
        load_state(model, bad)


def test_not_a_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(LaminaError, match="no such model directory"):
        lamina.load(tmp_path / "nope")
    with pytest.raises(LaminaError, match="no config.json"):
        lamina.load(tmp_path)


def test_truncated_weights_are_refused(tmp_path):
    save_model(tmp_path, GPT(GPTConfig.preset("tiny")))
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(LaminaError, match="not a readable safetensors file"):
        lamina.load(tmp_path)


def test_sequence_classifier_round_trips(tmp_path):
    """A classifier run (kind "classifier") loads back as a SequenceClassifier."""
    from lamina import EncoderConfig, SequenceClassifier

    torch.manual_seed(0)
    clf = SequenceClassifier(EncoderConfig(vocab_size=20, max_len=8), n_classes=3, pooling="mean")
    save_model(tmp_path, clf.eval())
    loaded, tok = lamina.load(tmp_path)
    assert isinstance(loaded, SequenceClassifier) and tok is None
    assert loaded.pooling == "mean" and loaded.classifier.out_features == 3
    ids = torch.randint(1, 20, (2, 8))
    assert torch.equal(clf(ids), loaded(ids))

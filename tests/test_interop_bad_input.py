"""Bad Hugging Face folders: each refused with one clear line, nothing executed, nothing written."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import lamina
from lamina import GPT, GPTConfig, LaminaError
from lamina.interop import load_hf

CONFIG = GPTConfig.preset("tiny")  # vocab 100, 32 positions, 32 wide, 2 layers


@pytest.fixture
def good(tmp_path) -> Path:
    """A valid HF GPT-2 folder written by lamina (checked against transformers elsewhere)."""
    d = tmp_path / "good"
    lamina.save_hf(GPT(CONFIG), str(d))
    return d


def refused(path: Path, match: str) -> str:
    with pytest.raises(LaminaError, match=match) as e:
        load_hf(path)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def edit_tensors(d: Path, change) -> None:
    tensors = load_file(d / "model.safetensors")
    change(tensors)
    save_file(tensors, d / "model.safetensors", {"format": "pt"})


def test_missing_folder_and_missing_weights(tmp_path, good):
    """No folder, or a folder with config.json but no weight file."""
    refused(tmp_path / "nope", "no such Hugging Face model folder")
    (good / "model.safetensors").unlink()
    refused(good, r"has no weights: expected one of model\.safetensors")


def test_config_that_is_not_gpt2(good):
    """Another model type, no config.json, broken JSON, or a setting lamina cannot run."""
    cfg = json.loads((good / "config.json").read_text())
    (good / "config.json").write_text(json.dumps({**cfg, "model_type": "falcon"}))
    refused(good, "model_type 'falcon' is not one lamina runs")
    (good / "config.json").write_text("{oops")
    refused(good, "not valid JSON")
    for key, value, match in [
        ("scale_attn_by_inverse_layer_idx", True, "cannot express scale_attn_by_inverse_layer_idx"),
        ("scale_attn_weights", False, "cannot express scale_attn_weights=False"),
        ("add_cross_attention", True, "cannot express add_cross_attention"),
        ("activation_function", "gelu", "cannot express activation_function='gelu'"),
        ("n_head", 5, "divisible by n_heads=5"),
        ("n_layer", "two", "n_layer: expected an integer >= 1"),
    ]:
        (good / "config.json").write_text(json.dumps({**cfg, key: value}))
        refused(good, match)
    (good / "config.json").unlink()
    refused(good, "missing file")


def test_wrong_shape_names_key_and_both_shapes(good):
    """A tensor of the wrong shape: its HF name, its shape and the shape config.json implies."""

    def shrink(t):
        t["transformer.h.1.attn.c_attn.weight"] = torch.zeros(32, 90)

    edit_tensors(good, shrink)
    refused(
        good, r"h\.1\.attn\.c_attn\.weight has shape \(32, 90\), config\.json implies \(32, 96\)"
    )


def test_unexpected_and_missing_keys_are_listed(good):
    """Extra tensors are listed by name; so are absent ones."""

    def extra(t):
        t["transformer.h.0.attn.rotary.weight"] = torch.zeros(3)
        t["transformer.h.2.ln_1.weight"] = torch.zeros(32)

    edit_tensors(good, extra)
    listed = "unexpected transformer.h.0.attn.rotary.weight, transformer.h.2.ln_1.weight"
    msg = refused(good, listed)
    assert msg.endswith(f"does not match its config.json: {listed}")
    edit_tensors(good, lambda t: t.pop("transformer.ln_f.bias"))
    refused(good, "missing transformer.ln_f.bias")


def test_truncated_safetensors(good):
    """Half a safetensors file is refused naming the file."""
    data = (good / "model.safetensors").read_bytes()
    (good / "model.safetensors").write_bytes(data[: len(data) // 2])
    refused(good, r"model\.safetensors is not a readable safetensors file")


class _Exploit:
    """Unpickling this calls os.system, which would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("layout", ["torch-zip", "raw-pickle"])
def test_pickle_that_runs_code_is_refused_and_not_run(good, tmp_path, layout):
    """A pytorch_model.bin whose unpickling would run a command: refused, the command never runs."""
    marker = tmp_path / "pwned"
    (good / "model.safetensors").unlink()
    payload = {"transformer.wte.weight": torch.zeros(100, 32), "evil": _Exploit(marker)}
    if layout == "torch-zip":
        torch.save(payload, good / "pytorch_model.bin")
    else:
        (good / "pytorch_model.bin").write_bytes(pickle.dumps(payload))
    msg = refused(good, r"pytorch_model\.bin refused: a pickle .*never runs code")
    assert "weights_only" not in msg and "safetensors" in msg, "no advice to unpickle it anyway"
    assert not marker.exists()


def test_bin_that_is_not_a_dict_of_tensors(good):
    """A weights_only-loadable file holding something else is refused."""
    (good / "model.safetensors").unlink()
    torch.save([torch.zeros(2)], good / "pytorch_model.bin")
    refused(good, "not hold a flat dict of tensors")


def test_sharded_safetensors_load(good):
    """model.safetensors.index.json with two shards loads like the single file."""
    tensors = load_file(good / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"a.safetensors": names[:half], "b.safetensors": names[half:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, good / shard, {"format": "pt"})
    index = {"weight_map": {k: s for s, keys in shards.items() for k in keys}}
    (good / "model.safetensors.index.json").write_text(json.dumps(index))
    (good / "model.safetensors").unlink()
    model = load_hf(good)
    assert torch.equal(model.embed.wte.weight, tensors["transformer.wte.weight"])
    for bad in ({"weight_map": {"x": "../a"}}, {"weight_map": ["a.safetensors"]}, []):
        (good / "model.safetensors.index.json").write_text(json.dumps(bad))
        refused(good, "no usable weight_map")


def test_export_failure_leaves_nothing(tmp_path, monkeypatch):
    """If writing fails midway, the new folder does not appear (no half-written export)."""
    import lamina.interop.hf_family as mod

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(mod, "write_json", boom)
    with pytest.raises(OSError, match="disk full"):
        lamina.save_hf(GPT(CONFIG), str(tmp_path / "out"))
    assert list(tmp_path.iterdir()) == []

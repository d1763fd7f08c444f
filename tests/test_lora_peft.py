"""LoRA adapters on disk: lamina's adapter file, and Hugging Face PEFT folders both ways.

A tiny random transformers LlamaForCausalLM (4 heads, 2 key/value heads, untied head) is saved
locally and opened by lamina; lamina's adapters (with random non-zero B) exported as a PEFT
folder load onto the transformers model through peft with lamina's logits; an adapter that
peft itself wrote loads into lamina with peft's logits. Nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import lamina
from lamina import LaminaError
from lamina.interop.adapters import (
    export_peft,
    import_peft,
    is_lora_folder,
    load_adapters,
    peft_names,
    read_lora_folder,
    save_adapters,
    save_lora_folder,
)
from lamina.lora import apply_lora, lora_config, lora_state_dict

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
transformers.logging.set_verbosity_error()

HF = dict(
    vocab_size=96, max_position_embeddings=32, hidden_size=32, intermediate_size=48,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
    bos_token_id=None, eos_token_id=None,
)  # fmt: skip


def _hf_model():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HF)).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.2 if "norm" in name else 0.15
            p.copy_((1.0 if "norm" in name else 0.0) + scale * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf-llama")
    _hf_model().save_pretrained(d)
    return d


def _ids():
    return torch.randint(0, HF["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(1))


def _randomize_b(model):
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("targets", ["qv", "k,o,down", "all,head"])
def test_peft_loads_lamina_adapters_with_equal_logits(base_folder, tmp_path, targets):
    ours = apply_lora(lamina.from_hf(str(base_folder)), r=4, alpha=12, targets=targets)
    _randomize_b(ours)
    out = export_peft(ours, tmp_path / "adapter", str(base_folder))
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], cfg["peft_type"]) == (4, 12.0, "LORA")
    hf = peft.PeftModel.from_pretrained(
        transformers.LlamaForCausalLM.from_pretrained(base_folder), out
    ).eval()
    ids = _ids()
    with torch.no_grad():
        plain = transformers.LlamaForCausalLM.from_pretrained(base_folder).eval()(ids).logits
        want, got = hf(ids).logits, ours(ids)
    assert (want - plain).abs().max() > 1e-2  # the adapters do change the output
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_lamina_loads_an_adapter_peft_wrote(base_folder, tmp_path):
    hf_cfg = peft.LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"],
        task_type="CAUSAL_LM", init_lora_weights=False,
    )  # fmt: skip
    torch.manual_seed(2)
    hf = peft.get_peft_model(transformers.LlamaForCausalLM.from_pretrained(base_folder), hf_cfg)
    hf.eval().save_pretrained(tmp_path / "peft")
    ours = import_peft(lamina.from_hf(str(base_folder)), tmp_path / "peft")
    assert lora_config(ours).targets == ("q", "v", "up")
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-5, rtol=0)


def test_adapter_file_round_trips_with_its_config(base_folder, tmp_path):
    ours = apply_lora(lamina.from_hf(str(base_folder)), r=2, alpha=4, dropout=0.1, targets="attn")
    _randomize_b(ours)
    path = save_adapters(ours, tmp_path / "adapters.safetensors")
    again = load_adapters(lamina.from_hf(str(base_folder)), path)
    assert lora_config(again) == lora_config(ours)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(again(ids), ours(ids))
    adapter_bytes = sum(t.numel() * t.element_size() for t in lora_state_dict(ours).values())
    assert path.stat().st_size < adapter_bytes + 4096  # the adapters only, not the base


def test_every_adapter_has_a_peft_name(base_folder):
    ours = apply_lora(lamina.from_hf(str(base_folder)), r=2, targets="all,head")
    names = peft_names(ours.config)
    assert set(lora_state_dict(ours)) == set(names)
    assert names["blocks.1.attn.qkv.lora_A.k"] == (
        "base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"
    )
    assert names["head.lora_B.head"] == "base_model.model.lm_head.lora_B.weight"


def test_refusals_are_one_line(base_folder, tmp_path):
    with pytest.raises(LaminaError, match="no LoRA adapters"):
        export_peft(lamina.from_hf(str(base_folder)), tmp_path / "x", "base")
    gpt2 = apply_lora(lamina.GPT(lamina.GPTConfig.preset("tiny")), r=2)
    with pytest.raises(LaminaError, match="Llama"):
        export_peft(gpt2, tmp_path / "y", "base")
    d = tmp_path / "dora"
    d.mkdir()
    (d / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "use_dora": True, "target_modules": ["q_proj"]})
    )
    with pytest.raises(LaminaError, match="use_dora"):
        import_peft(lamina.from_hf(str(base_folder)), d)


def test_lora_folder_holds_adapters_and_a_checked_reference_to_its_base(base_folder, tmp_path):
    """Only adapters and the base's path + sha256; lamina.open applies them on the fly; a
    changed base is refused."""
    base = tmp_path / "base"
    shutil.copytree(base_folder, base)
    bundle = lamina.open(base)
    ours = apply_lora(bundle.model, r=2, targets="qv")
    _randomize_b(ours)
    run = save_lora_folder(tmp_path / "run", ours, bundle.origin.to_dict())
    assert is_lora_folder(run) and not is_lora_folder(base)
    assert sorted(p.name for p in run.iterdir()) == ["adapters.safetensors", "config.json"]
    config, record, _ = read_lora_folder(run)
    assert config == lora_config(ours) and record["path"] == str(base.resolve())
    opened = lamina.open(run)
    assert lora_config(opened.model) == config and opened.origin.kind == "model"
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(opened.model(ids), ours(ids))
    weights = base / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 1
    weights.write_bytes(bytes(blob))
    with pytest.raises(LaminaError, match="changed since the adapters were trained"):
        lamina.open(run)

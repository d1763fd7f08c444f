"""`lamina merge`: a LoRA folder merged into a plain model with the same logits, exported as a
PEFT folder, sampled on the fly; refusals write nothing."""

from __future__ import annotations

import json

import pytest
import torch

import lamina
from lamina import GPT, GPTConfig
from lamina.cli import main
from lamina.interop.adapters import save_lora_folder
from lamina.lora import apply_lora, lora_config
from lamina.tokenizers.kinds import CharTokenizer


@pytest.fixture
def lora_run(tmp_path):
    """(LoRA folder, the adapted model): a llama-shaped base folder + adapters with random B."""
    tok = CharTokenizer.from_text("abcdefgh \n")
    torch.manual_seed(0)
    cfg = GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size, d_model=32, n_layers=2, d_ff=64)
    lamina.save(tmp_path / "base", GPT(cfg), tok)
    bundle = lamina.open(tmp_path / "base")
    model = apply_lora(bundle.model, r=2, alpha=4, targets="all")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.2)
    return save_lora_folder(tmp_path / "run", model, bundle.origin.to_dict()), model


def test_merge_writes_a_plain_model_with_the_same_logits(lora_run, tmp_path, capsys):
    run, adapted = lora_run
    out = tmp_path / "merged"
    assert main(["merge", str(run), "--out", str(out)]) == 0
    assert f"wrote {out} (merged: r 2" in capsys.readouterr().out
    merged, tok = lamina.load(out)
    assert lora_config(merged) is None and tok is not None
    ids = torch.randint(0, tok.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(merged(ids), adapted.eval()(ids), atol=1e-5, rtol=0)


def test_the_merged_model_converts_to_gguf(lora_run, tmp_path):
    """A merged model is an ordinary one: written as GGUF and read back, the same logits."""
    from lamina.interop.gguf import load_gguf, save_gguf

    run, adapted = lora_run
    assert main(["merge", str(run), "--out", str(tmp_path / "merged")]) == 0
    merged, tok = lamina.load(tmp_path / "merged")
    path = save_gguf(merged, tmp_path / "merged.gguf")
    again, _ = load_gguf(path)  # (a char tokenizer has no GGUF form; the weights do)
    ids = torch.randint(0, tok.vocab_size, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(again(ids), adapted.eval()(ids), atol=1e-5, rtol=0)


def test_peft_export_and_sampling_on_the_fly(lora_run, tmp_path, capsys):
    run, _ = lora_run
    peft_dir = tmp_path / "peft"
    assert main(["merge", str(run), "--peft", str(peft_dir), "--base-name", "my/base"]) == 0
    config = json.loads((peft_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "my/base" and config["r"] == 2
    assert (peft_dir / "adapter_model.safetensors").is_file()
    capsys.readouterr()
    args = ["sample", str(run), "--prompt", "abc", "--max-new-tokens", "4", "--seed", "1"]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("abc")


def test_refusals_write_nothing(lora_run, tmp_path, capsys):
    run, _ = lora_run
    base = tmp_path / "base"
    assert main(["merge", str(base), "--out", str(tmp_path / "x")]) == 2
    assert "not a LoRA run" in capsys.readouterr().err
    assert main(["merge", str(run), "--out", str(run / "inside")]) == 2
    assert "sits inside RUN" in capsys.readouterr().err
    assert main(["merge", str(run)]) == 2
    assert "--out DIR" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert main(["merge", str(run), "--out", str(tmp_path / "taken"), "--force"]) == 2
    assert "holds files lamina did not write" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (run / "inside").exists()
    with pytest.raises(lamina.LaminaError, match="LoRA adapters: merge them first"):
        lamina.save(tmp_path / "y", lamina.open(run).model)

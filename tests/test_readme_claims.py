"""What the README says lamina takes, taken (issue 34.6): `--init-from` a GGUF file, and a Hugging
Face folder's llama3 rope_scaling with a head_dim other than hidden_size / heads."""

from __future__ import annotations

import json

import pytest
import torch

import lamina
from lamina.cli import main
from lamina.interop.gguf import save_gguf
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT

NEW = "".join(f"a new tale: {i} birds sang at dawn.\n" for i in range(100))


def test_fine_tune_starts_from_a_gguf_file(tmp_path, capsys):
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("llama-tiny", vocab_size=256, block_size=32, d_model=32,
                                 n_heads=2, n_layers=1, d_ff=64))  # fmt: skip
    save_gguf(model, tmp_path / "m.gguf")
    (tmp_path / "new.txt").write_text(NEW)
    argv = ["train", "--init-from", str(tmp_path / "m.gguf"), "--tokenizer", "byte",
            "--data", str(tmp_path / "new.txt"), "--max-steps", "1", "--batch-size", "4",
            "--eval-batches", "1", "--quiet", "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    record = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert record["init_from"]["format"] == "gguf"
    assert record["model"]["d_model"] == model.config.d_model


def test_an_hf_folder_with_llama3_rope_scaling_and_a_wide_head_opens(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=24, max_position_embeddings=64,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    bundle = lamina.open(tmp_path / "hf")
    c = bundle.model.config
    assert c.rope_scaling is not None and c.rope_scaling.kind == "llama3" and c.head_dim == 24
    ids = torch.randint(0, 64, (1, 40))
    with torch.no_grad():
        want = hf(ids).logits
    assert torch.allclose(bundle.model(ids), want, atol=1e-4)

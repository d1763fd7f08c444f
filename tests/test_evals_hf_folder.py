"""A Hugging Face folder saved by transformers, scored as lm-eval scores it (issue 30.7).

The folder is what transformers writes from a GGUF (tests/real_model.save_smollm2_hf): its tied
matrix stored once, under `lm_head.weight`. lamina opens it as transformers does, and its
multiple-choice log-likelihoods on a task of the issue's shape (two lines of context, four next
lines each starting with a newline, target_delimiter "") equal transformers' own, computed the
way lm-eval's hf backend computes them (context + continuation encoded whole, then split).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_model

import lamina


def test_a_tied_head_stored_under_lm_head_only_is_the_embedding(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, tie_word_embeddings=True)  # fmt: skip
    hf = transformers.LlamaForCausalLM(cfg).eval()
    (tmp_path / "config.json").write_text(cfg.to_json_string())
    save_model(hf, str(tmp_path / "model.safetensors"))  # keeps one name: lm_head.weight
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert "model.embed_tokens.weight" not in f.keys() and "lm_head.weight" in f.keys()
    model = lamina.open(tmp_path).model
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        assert torch.allclose(model(ids), hf(ids).logits, atol=1e-5)

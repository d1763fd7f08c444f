"""Families in every verb: a tiny model (built by transformers, with a byte-level BPE tokenizer
and a ChatML template in its tokenizer_config.json) is sampled from, chatted with, evaluated,
fine-tuned one step with LoRA, and converted to GGUF and back, all through the command line as
a user runs it; each verb must exit 0 and the written folder come back as its family.

The three families whose layers differ most from Llama's run here (Mistral's window, Gemma 3's
sandwich norms, QK-norm and local rope, Phi-3's fused projections, partial rotary and longrope):
about 2.5 s each. Every family of the table passes the same test (add it to FAMILIES); the
others are held to transformers' logits in test_interop_hf_families.py."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_tokenizers import CHATML, TEXT, byte_level_bpe

from lamina.cli import main

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

SHAPE = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=32)  # fmt: skip
FAMILIES = {
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=8)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=16, sliding_window=8)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(original_max_position_embeddings=16,
                  rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                       partial_rotary_factor=0.5, short_factor=[1.0, 1.0, 2.0, 2.0],
                                       long_factor=[1.5, 2.0, 3.0, 4.0]))),
}  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> an HF folder (weights, tokenizer.json, tokenizer_config.json with ChatML)."""
    root = tmp_path_factory.mktemp("families")
    (root / "corpus.txt").write_text(TEXT[: len(TEXT) // 10], encoding="utf-8")  # 3 copies
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=byte_level_bpe(300), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML
    out = {}
    for name, (config_cls, model_cls, extra) in FAMILIES.items():
        cfg = getattr(transformers, config_cls)(
            vocab_size=len(fast), pad_token_id=0, bos_token_id=None, eos_token_id=2,
            **SHAPE, **extra,
        )  # fmt: skip
        torch.manual_seed(0)
        getattr(transformers, model_cls)(cfg).save_pretrained(root / name)
        fast.save_pretrained(root / name)
        out[name] = root / name
    return root, out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_verb_runs_the_family(folders, family, tmp_path, capsys):
    root, dirs = folders
    d, corpus = str(dirs[family]), str(root / "corpus.txt")
    assert main(["sample", d, "--prompt", "The quick", "--max-new-tokens", "4"]) == 0
    assert main(["chat", d, "--prompt", "hi", "--json", "--max-new-tokens", "4"]) == 0
    reply = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert isinstance(reply, dict) and reply
    assert main(["eval", d, "--task", "perplexity", "--data", corpus, "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert "perplexity" in json.dumps(scores)
    run = tmp_path / "lora"
    args = ["train", "--init-from", d, "--data", corpus, "--lora", "--lora-r", "2"]
    args += ["--max-steps", "1", "--batch-size", "2", "--out", str(run), "--quiet"]
    assert main(args) == 0
    assert (run / "adapters.safetensors").is_file()
    gguf, back = tmp_path / "m.gguf", tmp_path / "back"
    assert main(["convert", "--from", "hf", d, "--out", str(tmp_path / "m")]) == 0
    assert main(["convert", "--to", "gguf", str(tmp_path / "m"), "--out", str(gguf)]) == 0
    assert main(["convert", "--from", "gguf", str(gguf), "--out", str(back)]) == 0
    assert main(["convert", "--to", "hf", str(back), "--out", str(tmp_path / "hf")]) == 0
    written = json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"]
    assert written == json.loads((dirs[family] / "config.json").read_text())["model_type"]

"""Parity with Hugging Face Llama: logits, cached greedy tokens, round trips, refusals.

Every Hugging Face model here is built in the test by `transformers` with random weights; nothing
is downloaded. Run with `-s` to see the measured maximum logit differences.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import lamina
from lamina import GPT, GPTConfig, LaminaError
from lamina.generation import generate
from lamina.interop import (
    config_from_hf,
    hf_config,
    load_hf,
    save_hf,
)

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

BASE = dict(vocab_size=128, max_position_embeddings=96, hidden_size=64, intermediate_size=96)
# (name, LlamaConfig overrides): n_kv_heads 1, 2 and = n_heads; tied and untied heads
CONFIGS = [
    ("L2-h4-kv1-untied", dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1)),
    ("L2-h4-kv2-tied", dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            tie_word_embeddings=True)),
    ("L3-h8-kv8-untied", dict(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=8,
                              rope_theta=500000.0, rms_norm_eps=1e-5)),
    ("L2-h2-kv2-tied-bias", dict(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                 tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
]  # fmt: skip
IDS = [name for name, _ in CONFIGS]


def make_hf(seed: int = 0, **overrides):
    """A LlamaForCausalLM with random weights big enough to give non-trivial attention."""
    cfg = transformers.LlamaConfig(**{**BASE, **overrides}, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module", params=CONFIGS, ids=IDS)
def pair(request, tmp_path_factory):
    """(name, HF model, its saved folder, lamina model loaded from that folder)."""
    name, overrides = request.param
    hf = make_hf(**overrides)
    d = tmp_path_factory.mktemp(name)
    hf.save_pretrained(d)
    return name, hf, d, lamina.from_hf(str(d))


def test_logits_match_hugging_face(pair):
    """Same logits as LlamaForCausalLM within 1e-4 (fp32), full-length inputs."""
    name, hf, _, ours = pair
    n_pos = hf.config.max_position_embeddings
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, hf.config.vocab_size, (2, n_pos), generator=gen)
    with torch.no_grad():
        want, got = hf(ids).logits, ours(ids)
    diff = (want - got).abs().max().item()
    print(f"\n{name}: max |logit diff| = {diff:.3g} (logit scale {want.abs().max().item():.3g})")
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_cached_greedy_50_tokens_match_generate(pair):
    """lamina's KV-cached greedy decoding picks HF generate's 50 tokens (fixed-shape too)."""
    _, hf, _, ours = pair
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, hf.config.vocab_size, (2, 12), generator=gen)
    want = hf.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=50, min_new_tokens=50,
        do_sample=False, num_beams=1, pad_token_id=0,
    )  # fmt: skip
    got = generate(ours, prompt, 50)
    assert got.shape == (2, 62)
    assert torch.equal(got, want)
    assert torch.equal(generate(ours, prompt, 50, fixed_shape=True), want)


def test_hf_to_lamina_to_hf_is_bit_identical_and_loads(pair, tmp_path):
    """HF -> lamina -> HF: the same tensors under the same names; from_pretrained loads it."""
    _, hf, d, ours = pair
    save_hf(ours, tmp_path / "out")
    back = load_file(tmp_path / "out" / "model.safetensors")
    want = {k: v for k, v in hf.state_dict().items() if k in back}
    assert set(back) == set(want)
    assert all(torch.equal(back[k], want[k]) for k in back)
    again = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(0, hf.config.vocab_size, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, ours(ids), atol=1e-4, rtol=0)


def test_lamina_llama_tiny_exports_and_hf_agrees(tmp_path):
    """A lamina model (llama-tiny with an even wider GQA) written out, loaded by transformers."""
    torch.manual_seed(0)
    ours = GPT(GPTConfig.preset("llama-tiny", init_std=0.1)).eval()
    save_hf(ours, tmp_path / "hf")
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, 65, (2, 64))
    with torch.no_grad():
        diff = (hf(ids).logits - ours(ids)).abs().max().item()
    assert diff < 1e-4, diff
    back = load_hf(tmp_path / "hf")
    assert back.config == ours.config
    assert all(torch.equal(a, b) for a, b in zip(back.parameters(), ours.parameters(), strict=True))


def test_sharded_safetensors_load(tmp_path):
    hf = make_hf(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours = lamina.from_hf(tmp_path)
    ids = torch.randint(0, 128, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=0)


def test_config_translation_both_ways():
    c = GPTConfig.preset("llama-tiny")
    assert config_from_hf(hf_config(c)) == c
    legacy = {"model_type": "llama", "rope_theta": 5e5, "rope_scaling": None, **BASE}
    assert config_from_hf(legacy).rope_theta == 5e5


@pytest.mark.parametrize(
    "overrides, setting",
    [
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "llama3' lacks .*low_freq"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn'"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "type 'dynamic'"),
        ({"attention_bias": True}, "a bias on o_proj only"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"num_key_value_heads": 3, "num_attention_heads": 4}, "n_kv_heads=3"),
        ({"model_type": "gemma"}, "model_type 'gemma' is not one lamina runs"),
    ],
)
def test_import_refuses_what_lamina_cannot_express(tmp_path, overrides, setting):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **BASE, **overrides}))
    with pytest.raises(LaminaError, match=setting.replace("(", r"\(").replace("[", r"\[")):
        load_hf(tmp_path)


@pytest.mark.parametrize(
    "overrides, setting",
    [
        ({"norm": "layer"}, "norm='layer'"),
        ({"activation": "relu2"}, "activation='relu2'"),
        ({"logit_softcap": 30.0}, "logit_softcap=30.0"),
        ({"norm_gain": False}, "norm_gain=False"),
    ],
)
def test_export_refuses_what_llama_cannot_express(tmp_path, overrides, setting):
    model = GPT(GPTConfig.preset("llama-tiny", **overrides))
    with pytest.raises(LaminaError, match=setting):
        save_hf(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "overrides, family", [({"qk_norm": True}, "qwen3"), ({"qkv_bias": True}, "qwen2")]
)
def test_export_writes_the_family_that_expresses_the_model(tmp_path, overrides, family):
    """What Llama cannot express but another family can is written as that family."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("llama-tiny", init_std=0.1, **overrides)).eval()
    save_hf(model, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == family
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(0, 65, (1, 24))
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids), atol=1e-4, rtol=0)


def test_tokenizer_json_is_carried_both_ways(tmp_path):
    """A folder with a byte-level BPE tokenizer.json: lamina convert keeps it, and writes it."""
    from lamina.cli import main
    from lamina.tokenizers.subword import BPETokenizer

    tok = BPETokenizer.train("the cat sat on the mat; the dog sat on the log. " * 20, 300)
    hf = make_hf(vocab_size=tok.vocab_size, num_hidden_layers=1, num_attention_heads=2)
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text(tok.hf_json)
    assert (
        main(["convert", "--from", "hf", str(tmp_path / "hf"), "--out", str(tmp_path / "m")]) == 0
    )
    model, carried = lamina.load(tmp_path / "m")
    assert carried.encode("the cat") == tok.encode("the cat")
    assert main(["convert", "--to", "hf", str(tmp_path / "m"), "--out", str(tmp_path / "o")]) == 0
    assert json.loads((tmp_path / "o" / "tokenizer.json").read_text()) == json.loads(tok.hf_json)
    again = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "o").eval()
    ids = torch.tensor([tok.encode("the cat sat")])
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids), atol=1e-4, rtol=0)


def test_a_sentencepiece_tokenizer_with_its_template_is_carried_both_ways(tmp_path, capsys):
    """Llama 2 style (byte-fallback BPE, Metaspace, <s> added): once dropped with a note, now
    carried as kind "pretrained" with its specials, add-bos rule and chat template."""
    from tiny_tokenizers import CHATML, sentencepiece_bpe

    from lamina.cli import main

    fast = transformers.LlamaTokenizerFast(
        tokenizer_object=sentencepiece_bpe(), bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHATML
    hf = make_hf(vocab_size=len(fast), num_hidden_layers=1, num_attention_heads=2)
    hf.save_pretrained(tmp_path / "hf")
    fast.save_pretrained(tmp_path / "hf")
    convert = ["convert", "--from", "hf", str(tmp_path / "hf"), "--out", str(tmp_path / "m")]
    assert main(convert) == 0 and "tokenizer: pretrained" in capsys.readouterr().out
    _, carried = lamina.load(tmp_path / "m")
    text = "The quick brown fox, café 😀"
    assert carried.encode_prompt(text) == fast.encode(text) and carried.add_bos
    assert carried.chat_template == CHATML and carried.eos_id == fast.eos_token_id
    assert main(["convert", "--to", "hf", str(tmp_path / "m"), "--out", str(tmp_path / "o")]) == 0
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "o")
    assert again.encode(text) == fast.encode(text)
    chat = [{"role": "user", "content": "hi"}]
    out = again.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)
    assert list(out["input_ids"]) == carried.render_chat(chat)

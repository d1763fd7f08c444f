"""Hugging Face families beyond GPT-2 and plain Llama, each against transformers' own model.

Every model is built here by `transformers` from a tiny config with random weights and saved to
a folder; `lamina.open` reads the folder and its logits must equal transformers' (fp32, 1e-4).
Families: Llama 3.x with rope_scaling "llama3", SmolLM2 (a Llama with a tied head), Qwen2 (q/k/v
biases, none on o_proj), Mistral (no sliding window inside the context), Qwen3 (QK-norm and a
head_dim other than hidden_size / heads). Run with `-s` to see the differences.
"""

from __future__ import annotations

import json

import pytest
import torch

import lamina
from lamina import GPT, LaminaError

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

BASE = dict(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=80,
            bos_token_id=None, eos_token_id=None)  # fmt: skip
LLAMA3 = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
              high_freq_factor=4.0, original_max_position_embeddings=24)  # fmt: skip
FAMILIES = {
    "llama3-scaled": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=LLAMA3)),
    "smollm2": ("LlamaConfig", "LlamaForCausalLM",
                dict(tie_word_embeddings=True, rope_parameters={"rope_type": "default",
                                                                "rope_theta": 100000.0})),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=20)),
}  # fmt: skip


def build(family: str, seed: int = 0):
    config_cls, model_cls, extra = FAMILIES[family]
    cfg = getattr(transformers, config_cls)(**{**BASE, **extra})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.2 if "norm" in name else 0.15
            p.copy_((1.0 if "norm" in name else 0.0) + scale * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    hf = build(request.param)
    d = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(d)
    return request.param, hf, d, lamina.open(d)


def test_logits_equal_transformers(pair):
    """Full-context logits equal the transformers model's within 1e-4 (fp32)."""
    name, hf, _, bundle = pair
    ids = torch.randint(0, BASE["vocab_size"], (2, BASE["max_position_embeddings"]),
                        generator=torch.Generator().manual_seed(1))  # fmt: skip
    with torch.no_grad():
        want, got = hf(ids).logits, bundle.model(ids)
    diff = (want - got).abs().max().item()
    print(f"\n{name}: max |logit diff| = {diff:.3g} (scale {want.abs().max().item():.3g})")
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_family_features_are_the_configs_own(pair):
    """Each family lands on the lamina fields that express it (and the bundle says 'hf')."""
    name, _, d, bundle = pair
    c = bundle.model.config
    assert bundle.origin.kind == "hf" and bundle.origin.path == d.resolve()
    expect = {
        "llama3-scaled": lambda: c.rope_scaling is not None and c.rope_scaling.kind == "llama3",
        "smollm2": lambda: c.tie_weights and c.rope_theta == 100000.0,
        "qwen2": lambda: c.qkv_bias and not c.bias,
        "mistral": lambda: not c.qkv_bias and not c.bias,
        "qwen3": lambda: c.qk_norm and c.head_dim == 20 and c.d_model == 48,
    }[name]
    assert expect(), c


def test_llama3_scaling_changes_what_the_model_computes(tmp_path):
    """Without its rope_scaling the same weights give other logits: the scaling is not a no-op."""
    build("llama3-scaled").save_pretrained(tmp_path)
    bundle = lamina.open(tmp_path)
    plain = GPT(bundle.model.config.replace(rope_scaling=None))
    plain.load_state_dict(bundle.model.state_dict())
    ids = torch.arange(60)[None] % BASE["vocab_size"]
    with torch.no_grad():
        assert (plain(ids) - bundle.model(ids)).abs().max() > 1e-3


def test_a_sliding_window_inside_the_context_is_refused(tmp_path):
    """Mistral v0.1's 4096-token window on a longer context is refused in one line."""
    cfg = {"model_type": "mistral", **BASE, "sliding_window": 16}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LaminaError, match="sliding_window=16 shorter than its context"):
        lamina.open(tmp_path)


def test_qwen2_window_is_ignored_when_not_used(tmp_path):
    """Qwen2 configs carry a sliding_window that transformers ignores without use_sliding_window."""
    from lamina.interop.hf_llama import config_from_hf_llama

    cfg = {"model_type": "qwen2", **BASE, "sliding_window": 16, "use_sliding_window": False}
    assert config_from_hf_llama(cfg).qkv_bias

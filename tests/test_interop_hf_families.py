"""Every family record against transformers' own model, in both formats and both directions.

For each family a tiny model with random weights is built here by `transformers` (the logit
reference) and saved as a folder. lamina opens it; then, per family:
  * logits equal transformers' within 1e-4 (fp32) and greedy decoding (lamina's KV-cached
    `generate`, transformers' `generate`) gives the same 32 tokens;
  * lamina writes it back as a Hugging Face folder of the same model_type, and transformers
    reloads that folder with the same logits;
  * lamina writes it as an f32 GGUF file and reads it back to the same config and logits; where
    transformers' GGUF loader reads that architecture with these settings, its logits from
    lamina's file equal lamina's.
References are built once per module. Run with `-s` to see the figures.
"""

from __future__ import annotations

import json

import pytest
import torch

import lamina
from lamina import GPT, LaminaError
from lamina.interop.family_config import canonical, differences
from lamina.interop.gguf import load_gguf, read_gguf, save_gguf

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

BASE = dict(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=80,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)  # fmt: skip
LLAMA3 = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
              high_freq_factor=4.0, original_max_position_embeddings=24)  # fmt: skip
# name -> (config class, model class, config overrides, transformers reads its GGUF alike)
FAMILIES = {
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=LLAMA3), False),
    "smollm2": ("LlamaConfig", "LlamaForCausalLM",
                dict(tie_word_embeddings=True, rope_parameters={"rope_type": "default",
                                                                "rope_theta": 100000.0}), True),
    "qwen2.5": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True), True),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None), True),
    # transformers' qwen3 GGUF reader takes head_dim from Qwen3Config's default, 128
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=128), True),
    # llama.cpp files Mistral as arch llama, with no window transformers' reader would take
    "mistral-window": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=16), False),
    # query_pre_attn_scalar and the caps at the config class's defaults: transformers' GGUF
    # reader does not read them from the file
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(head_dim=16, sliding_window=16, query_pre_attn_scalar=256), True),
    # six layers: five sliding, one global (the default pattern, which transformers' GGUF
    # reader assumes); the global and local rope bases differ
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(head_dim=16, sliding_window=16, num_hidden_layers=6,
                    query_pre_attn_scalar=256), True),
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(original_max_position_embeddings=32,
                  rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                       partial_rotary_factor=0.5,
                                       short_factor=[1.0, 1.5, 2.0], long_factor=[1.2, 3.0, 7.0])),
             False),
}  # fmt: skip
# what lamina writes back: the first family that expresses the model (a Mistral without a
# window is a Llama)
MODEL_TYPE = {"llama3": "llama", "smollm2": "llama", "qwen2.5": "qwen2", "mistral": "llama",
              "mistral-window": "mistral", "gemma3": "gemma3_text"}  # fmt: skip
GGUF_ARCH = {"qwen2.5": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3": "gemma3",
             "phi3": "phi3"}  # fmt: skip
IDS = torch.randint(0, BASE["vocab_size"], (2, BASE["max_position_embeddings"]),
                    generator=torch.Generator().manual_seed(1))  # fmt: skip


def build(family: str, seed: int = 0):
    config_cls, model_cls, extra, _ = FAMILIES[family]
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
    with torch.no_grad():
        want, got = hf(IDS).logits, bundle.model(IDS)
    diff = (want - got).abs().max().item()
    print(f"\n{name}: max |logit diff| = {diff:.3g} (scale {want.abs().max().item():.3g})")
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_greedy_tokens_equal_transformers(pair):
    """32 greedy tokens from a short prompt: lamina's cached decode and transformers' agree."""
    name, hf, _, bundle = pair
    prompt = IDS[:1, :8]
    with torch.no_grad():
        want = hf.generate(prompt, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    got = lamina.generate(bundle.model, prompt, 32)
    agree = (want[0, 8:] == got[0, 8:]).float().mean().item()
    print(f"\n{name}: greedy agreement {agree:.3f} over 32 tokens")
    assert torch.equal(got, want)


def test_exported_folder_reloads_in_transformers(pair, tmp_path):
    """lamina writes the family back (same model_type); transformers' logits from it agree."""
    name, hf, _, bundle = pair
    lamina.save_hf(bundle.model, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == MODEL_TYPE.get(name, name)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0)
    assert lamina.open(tmp_path / "out").model.config == bundle.model.config


def test_gguf_round_trip_and_transformers_reads_it(pair, tmp_path):
    """f32 GGUF out and back in: the same config (what GGUF carries) and logits; transformers'
    GGUF loader, where it reads the family, gives lamina's logits from lamina's file."""
    name, _, _, bundle = pair
    model = bundle.model
    if name == "mistral-window":  # llama.cpp reads no window from arch llama: said once
        with pytest.warns(lamina.LaminaWarning, match="llama.cpp reads no sliding window"):
            path = save_gguf(model, tmp_path / "m.gguf")
    else:
        path = save_gguf(model, tmp_path / "m.gguf")
    arch = read_gguf(path).metadata["general.architecture"]
    assert arch == GGUF_ARCH.get(name, "llama")
    back, _ = load_gguf(path)
    assert differences(canonical(back.config, "gguf"), canonical(model.config, "gguf")) == []
    with torch.no_grad():
        ours = model(IDS)
        torch.testing.assert_close(back(IDS), ours, atol=1e-4, rtol=0)
    if not FAMILIES[name][3]:
        return
    pytest.importorskip("accelerate")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="m.gguf", dtype=torch.float32
    ).eval()
    with torch.no_grad():
        diff = (theirs(IDS).logits - ours).abs().max().item()
    print(f"\n{name}: transformers from lamina's GGUF, max |logit diff| = {diff:.3g}")
    assert diff < 1e-4


def test_family_features_are_the_configs_own(pair):
    """Each family lands on the lamina fields that express it (and the bundle says 'hf')."""
    name, _, d, bundle = pair
    c = bundle.model.config
    assert bundle.origin.kind == "hf" and bundle.origin.path == d.resolve()
    expect = {
        "llama3": lambda: c.rope_scaling is not None and c.rope_scaling.kind == "llama3",
        "smollm2": lambda: c.tie_weights and c.rope_theta == 100000.0,
        "qwen2.5": lambda: c.qkv_bias and not c.bias,
        "mistral": lambda: not c.qkv_bias and not c.bias,
        "qwen3": lambda: c.qk_norm and c.head_dim == 128 and c.d_model == 48,
        "mistral-window": lambda: c.sliding_window == 16 and c.layer_types is None,
        "gemma2": lambda: (
            c.layer_types == ("sliding", "full")
            and c.attn_softcap == 50.0
            and c.logit_softcap == 30.0
            and c.norm_offset == 1.0
            and c.sandwich_norm
            and c.activation == "geglu"
            and c.attn_scale == 256**-0.5
            and c.embed_scale == 48**0.5
        ),
        "gemma3": lambda: (
            c.layer_types == ("sliding",) * 5 + ("full",)
            and c.qk_norm
            and c.rope_theta == 1e6
            and c.rope_local_theta == 10000.0
            and c.attn_softcap is None
        ),
        "phi3": lambda: c.rotary_dim == 6 and c.rope_scaling.kind == "longrope",
    }[name]
    assert expect(), c


def test_llama3_scaling_changes_what_the_model_computes(tmp_path):
    """Without its rope_scaling the same weights give other logits: the scaling is not a no-op;
    the GGUF file carries it as rope_freqs.weight, read back to the same llama3 parameters."""
    build("llama3").save_pretrained(tmp_path)
    bundle = lamina.open(tmp_path)
    plain = GPT(bundle.model.config.replace(rope_scaling=None))
    plain.load_state_dict(bundle.model.state_dict())
    ids = torch.arange(60)[None] % BASE["vocab_size"]
    with torch.no_grad():
        assert (plain(ids) - bundle.model(ids)).abs().max() > 1e-3
    path = save_gguf(bundle.model, tmp_path / "m.gguf")
    assert "rope_freqs.weight" in read_gguf(path).tensors
    back = load_gguf(path)[0].config
    assert back.rope_scaling.kind == "llama3" and differences(back, bundle.model.config) == []


def test_llama3_parameters_come_back_from_rope_freqs():
    """Llama 3.x's own scaling (head 64, theta 5e5, factor 8, bounds 1 and 4, 8192): its
    rope_freqs factors give back exactly these parameters; factors no llama3 scaling makes
    give None (the loader refuses them by name)."""
    from lamina.attention import RopeScaling
    from lamina.interop.family_rope import freq_factors, llama3_from_factors

    real = RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    back = llama3_from_factors(freq_factors(real, 64, 500000.0), 64, 500000.0)
    assert back.original_max_positions == 8192 and back.factor == 8.0
    assert back.high_freq_factor == pytest.approx(4.0, rel=1e-5)
    bumpy = freq_factors(real, 64, 500000.0)
    bumpy[3] = 2.5
    assert llama3_from_factors(bumpy, 64, 500000.0) is None


def test_qwen2_window_is_ignored_when_not_used():
    """Qwen2 configs carry a sliding_window that transformers ignores without use_sliding_window;
    with it, the windowed upper layers are refused by name."""
    from lamina.interop import config_from_hf

    cfg = {"model_type": "qwen2", **BASE, "sliding_window": 16, "use_sliding_window": False}
    assert config_from_hf(cfg).qkv_bias
    with pytest.raises(LaminaError, match="use_sliding_window=true"):
        config_from_hf({**cfg, "use_sliding_window": True})


def test_llama_cpp_rules_the_gguf_files_leave_out():
    """What llama.cpp hard-codes rather than stores: Gemma 2/3's window pattern (every 2nd or
    6th layer global), Gemma 3's sliding-layer base 10000, the 27B Gemmas' query scale."""
    from lamina.interop import config_from_hf
    from lamina.interop.families import FAMILIES as RECORDS
    from lamina.interop.family_gguf import to_gguf
    from lamina.interop.gguf import gguf_config

    hf = {**BASE, "model_type": "gemma2", "hidden_size": 64, "num_attention_heads": 4,
          "head_dim": 8, "query_pre_attn_scalar": 16}  # fmt: skip
    for layers, scale in [(46, 16**-0.5), (4, None)]:
        c = config_from_hf({**hf, "num_hidden_layers": layers})
        assert c.attn_scale == 16**-0.5 and c.layer_types[:2] == ("sliding", "full")
        meta, _ = to_gguf(RECORDS["gemma2"], c)
        meta = {k: v for k, v in meta.items() if k != "gemma2.attention.scale"}
        back = gguf_config({"general.architecture": "gemma2", **meta})
        assert back.attn_scale == scale and back.layer_types == c.layer_types
    g3 = config_from_hf({**hf, "model_type": "gemma3_text", "num_hidden_layers": 7})
    meta, _ = to_gguf(RECORDS["gemma3"], g3)
    assert "gemma3.rope.freq_base_swa" not in meta  # llama.cpp's own value
    back = gguf_config({"general.architecture": "gemma3", **meta})
    assert back.layer_types == ("sliding",) * 5 + ("full", "sliding")
    assert back.rope_local_theta == 10000.0


@pytest.mark.parametrize(
    "config, message",
    [
        (dict(model_type="gemma2", hidden_activation="gelu"), "hidden_activation='gelu'"),
        (dict(model_type="gemma3_text", layer_types=["chunked_attention"] * 2), "layer_types="),
        (dict(model_type="phi3", rope_scaling={"rope_type": "yarn", "factor": 2.0}),
         "rope_scaling type 'yarn' \\(the Phi-3 family runs 'default', 'longrope'\\)"),
        (dict(model_type="qwen2", partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
        (dict(model_type="gemma3"), "model_type 'gemma3' is not one lamina runs"),
    ],
)  # fmt: skip
def test_what_a_family_cannot_run_is_refused_by_name(config, message):
    from lamina.interop import config_from_hf

    with pytest.raises(LaminaError, match=message):
        config_from_hf({**BASE, **config})


@pytest.mark.parametrize("name", ["gemma3", "phi3"])
def test_peft_adapters_of_a_family(name, tmp_path):
    """LoRA adapters on a Gemma 3 export under the record's names and peft applies them with
    lamina's logits; Phi-3's fused qkv_proj has no per-projection PEFT name: refused by name."""
    peft = pytest.importorskip("peft")
    from lamina.interop.adapters import export_peft
    from lamina.lora import apply_lora

    build(name).save_pretrained(tmp_path / "base")
    ours = apply_lora(lamina.open(tmp_path / "base").model, r=2, alpha=4, targets="all")
    with torch.no_grad():
        for n, p in ours.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.1)
    if name == "phi3":
        with pytest.raises(LaminaError, match="PEFT adapters of a Phi-3 model"):
            export_peft(ours, tmp_path / "adapter", str(tmp_path / "base"))
        return
    export_peft(ours, tmp_path / "adapter", str(tmp_path / "base"))
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    theirs = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(IDS).logits, ours(IDS), atol=1e-5, rtol=0)


def test_transformers_4_configs_read_as_their_5_forms():
    """config.json files written by transformers 4.x (rope_scaling and rope_theta at the top,
    Gemma 3's rope_local_base_freq and sliding_window_pattern, no layer_types) give the same
    lamina config as transformers 5's rope_parameters and layer_types."""
    from lamina.interop import config_from_hf

    g3 = {**BASE, "model_type": "gemma3_text", "head_dim": 16, "sliding_window": 16,
          "num_hidden_layers": 6}  # fmt: skip
    v4 = {**g3, "rope_theta": 1e6, "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6,
          "rope_scaling": {"rope_type": "linear", "factor": 8.0}}  # fmt: skip
    v5 = {**g3, "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
          "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                 "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "default",
                                                    "rope_theta": 10000.0}}}  # fmt: skip
    assert config_from_hf(v4) == config_from_hf(v5)
    longrope = {"short_factor": [1.0] * 3, "long_factor": [2.0] * 3}
    phi = {**BASE, "model_type": "phi3", "original_max_position_embeddings": 32}
    v4 = {**phi, "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
          "rope_scaling": {"type": "longrope", **longrope}}  # fmt: skip
    v5 = {**phi, "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                     "partial_rotary_factor": 0.5, **longrope}}  # fmt: skip
    assert config_from_hf(v4) == config_from_hf(v5)
    assert config_from_hf(v5).rotary_dim == 6

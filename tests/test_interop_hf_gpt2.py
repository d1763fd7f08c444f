"""Parity with Hugging Face GPT-2: logits, greedy tokens, and bit-exact round trips of weights.

Every Hugging Face model here is built in the test by `transformers` with random weights; nothing
is downloaded. Run with `-s` to see the measured maximum logit differences.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import lamina
from lamina import GPT, GPTConfig
from lamina.interop import config_from_hf, hf_config, load_hf, save_hf

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

# (name, GPT2Config overrides): 2-4 layers, 32-128 wide, vocab 100..50,257, qkv bias as GPT-2
CONFIGS = [
    ("v100-L2-d32", dict(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=4)),
    (
        "v1000-L3-d64-ninner-eps",
        dict(
            vocab_size=1000,
            n_positions=96,
            n_embd=64,
            n_layer=3,
            n_head=8,
            n_inner=96,
            layer_norm_epsilon=1e-6,
            activation_function="gelu_pytorch_tanh",
        ),
    ),  # fmt: skip
    (
        "v300-L4-d128-untied",
        dict(
            vocab_size=300,
            n_positions=80,
            n_embd=128,
            n_layer=4,
            n_head=4,
            tie_word_embeddings=False,
        ),
    ),  # fmt: skip
    (
        "v211-L2-d48-relu",
        dict(
            vocab_size=211,
            n_positions=64,
            n_embd=48,
            n_layer=2,
            n_head=3,
            activation_function="relu",
        ),
    ),  # fmt: skip
    ("v50257-L2-d32", dict(vocab_size=50257, n_positions=72, n_embd=32, n_layer=2, n_head=2)),
]
IDS = [name for name, _ in CONFIGS]
MEASURED: dict[str, float] = {}


def make_hf(seed: int = 0, **overrides):
    """A GPT2LMHeadModel with random weights big enough to give non-trivial attention."""
    cfg = transformers.GPT2Config(bos_token_id=None, eos_token_id=None, **overrides)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name and name.endswith("weight"):
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
    """Same logits as GPT2LMHeadModel within 1e-4 (fp32), for a batch of full-length inputs."""
    name, hf, _, ours = pair
    n_pos = hf.config.n_positions
    ids = torch.randint(
        0, hf.config.vocab_size, (2, n_pos), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        want, got = hf(ids).logits, ours(ids)
    diff = (want - got).abs().max().item()
    MEASURED[name] = diff
    print(f"\n{name}: max |logit diff| = {diff:.3g} (logit scale {want.abs().max().item():.3g})")
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_greedy_50_tokens_match_generate(pair):
    """lamina's greedy decoder picks the same 50 tokens as HF generate(do_sample=False)."""
    _, hf, _, ours = pair
    prompt = torch.randint(
        0, hf.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2)
    )
    assert prompt.shape[1] + 50 <= hf.config.n_positions
    want = hf.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=50, min_new_tokens=50,
        do_sample=False, num_beams=1, pad_token_id=0,
    )  # fmt: skip
    got = ours.greedy(prompt, 50)
    assert got.shape == (2, 62)
    assert torch.equal(got, want)


def test_hf_to_lamina_to_hf_is_bit_identical(pair, tmp_path):
    """HF -> lamina -> HF: the same tensors under the same names, bit for bit."""
    _, hf, d, ours = pair
    lamina.save_hf(ours, str(tmp_path / "again"))
    back, info = transformers.GPT2LMHeadModel.from_pretrained(
        tmp_path / "again", output_loading_info=True
    )
    assert all(not info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    original, written = (
        load_file(d / "model.safetensors"),
        load_file(tmp_path / "again/model.safetensors"),
    )
    assert set(written) == set(original)
    assert all(torch.equal(written[k], original[k]) for k in original)
    want = hf.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in back.state_dict().items())


def test_lamina_to_hf_to_lamina_is_bit_identical(pair, tmp_path):
    """lamina -> HF (loaded and re-saved by transformers) -> lamina: same weights and config."""
    _, _, _, loaded = pair
    torch.manual_seed(3)
    ours = GPT(loaded.config)  # fresh lamina weights
    lamina.save_hf(ours, str(tmp_path / "hf"))
    hf, info = transformers.GPT2LMHeadModel.from_pretrained(
        tmp_path / "hf", output_loading_info=True
    )
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    hf.save_pretrained(tmp_path / "resaved")
    back = load_hf(tmp_path / "resaved")
    assert back.config == ours.config
    want = ours.state_dict()
    assert set(back.state_dict()) == set(want)
    assert all(torch.equal(v, want[k]) for k, v in back.state_dict().items())
    if ours.config.tie_weights:
        assert back.head.weight.data_ptr() == back.embed.wte.weight.data_ptr()


def test_pytorch_model_bin_without_prefix_and_with_buffers(tmp_path):
    """pytorch_model.bin, keys without `transformer.`, mask buffers and a tied lm_head: ignored."""
    hf = make_hf(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    state = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items()}
    for i in range(2):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 32, 32, dtype=torch.bool))
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    state["lm_head.weight"] = state["wte.weight"].clone()
    torch.save(state, tmp_path / "pytorch_model.bin")
    hf.config.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    ids = torch.arange(20).view(1, 20)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's imports
def test_compiled_prefix_is_stripped_on_read_and_write(tmp_path):
    """`_orig_mod.` in a checkpoint's keys is ignored; a torch.compile'd model saves plain keys."""
    hf = make_hf(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    hf.save_pretrained(tmp_path / "hf")
    tensors = load_file(tmp_path / "hf/model.safetensors")
    save_file(
        {f"_orig_mod.{k}": v for k, v in tensors.items()},
        tmp_path / "hf/model.safetensors",
        {"format": "pt"},
    )
    ours = load_hf(tmp_path / "hf")
    save_hf(torch.compile(ours), tmp_path / "out")
    written = load_file(tmp_path / "out/model.safetensors")
    assert set(written) == set(tensors)


def test_half_precision_checkpoints_load_into_fp32(tmp_path):
    """fp16 / bf16 weights load (upcast) into an fp32 model, equal to the HF model in that dtype."""
    hf = make_hf(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=4).to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    assert ours.head.weight.dtype == torch.float32
    assert torch.equal(ours.embed.wte.weight, hf.transformer.wte.weight.float())


def test_config_translation_both_ways():
    """config_from_hf(hf_config(c)) == c for GPT-2-expressible configs, with dtype recorded."""
    for c in (
        GPTConfig.preset("gpt2-small"),
        GPTConfig.preset(
            "tiny", d_ff=48, activation="relu", tie_weights=False, layer_norm_eps=1e-6
        ),
    ):
        assert config_from_hf(hf_config(c)) == c
    assert hf_config(GPTConfig.preset("tiny"), torch.bfloat16)["dtype"] == "bfloat16"


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        (dict(norm_first=False), "norm_first=False"),
        (dict(positions="sinusoidal"), "positions='sinusoidal'"),
        (dict(bias=False), "bias=False"),
        (dict(qkv_bias=False), "qkv_bias=False"),
        (dict(norm="rms"), "norm='rms'"),
        (dict(norm_gain=False), "norm_gain=False"),
        (dict(activation="swiglu"), "activation='swiglu'"),
        (dict(activation="relu2"), "activation='relu2'"),
        (dict(n_kv_heads=2), "n_kv_heads=2"),
        (dict(qk_norm=True), "qk_norm=True"),
        (dict(logit_softcap=15.0), "logit_softcap=15.0"),
    ],
)
def test_export_refuses_what_gpt2_cannot_express(tmp_path, overrides, setting):
    """Post-LN, sinusoidal positions, missing biases: a LaminaError naming it, nothing written."""
    model = GPT(GPTConfig.preset("tiny", **overrides))
    with pytest.raises(lamina.LaminaError, match=setting):
        lamina.save_hf(model, str(tmp_path / "out"))
    assert list(tmp_path.iterdir()) == []


def test_export_into_an_existing_folder_replaces_files(tmp_path):
    """Saving into an existing folder overwrites config.json and model.safetensors."""
    a, b = GPT(GPTConfig.preset("tiny")), GPT(GPTConfig.preset("tiny", n_layers=3))
    lamina.save_hf(a, str(tmp_path))
    lamina.save_hf(b, str(tmp_path))
    assert load_hf(tmp_path).config.n_layers == 3
    names = sorted(p.name for p in Path(tmp_path).iterdir())
    assert names == [".lamina", "config.json", "model.safetensors"]

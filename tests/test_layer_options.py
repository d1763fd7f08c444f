"""The layer options of Gemma 2/3, Phi-3/Phi-4-mini and Mistral, each held to transformers' own
modules (built here with tiny random weights), then whole tiny models of each family with a
hand-copied state dict: logits, parameter counts, cached decode against a full recompute.
Each option alone through every decode path: tests/test_layer_options_decode.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from lamina import GPTConfig
from lamina.attention import MultiHeadAttention, attention_mask
from lamina.block import FeedForward, RMSNorm
from lamina.generation import generate
from lamina.models.gpt import GPT
from lamina.models.params import count_params
from lamina.native.coverage import unsupported
from lamina.rope import RopeScaling, apply_rotary, rotary_tables

transformers = pytest.importorskip("transformers")
from transformers import masking_utils  # noqa: E402
from transformers.models.gemma2 import modeling_gemma2 as g2  # noqa: E402
from transformers.models.gemma3 import modeling_gemma3 as g3  # noqa: E402
from transformers.models.mistral import modeling_mistral as mis  # noqa: E402
from transformers.models.phi3 import modeling_phi3 as phi3  # noqa: E402

V, D, H, HKV, HD, F, T = 64, 32, 4, 2, 8, 48, 14
SHAPE = dict(
    vocab_size=V,
    hidden_size=D,
    intermediate_size=F,
    num_hidden_layers=3,
    num_attention_heads=H,
    num_key_value_heads=HKV,
    head_dim=HD,
    max_position_embeddings=64,
    attention_dropout=0.0,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
LAMINA = dict(
    vocab_size=V,
    block_size=64,
    d_model=D,
    n_heads=H,
    n_kv_heads=HKV,
    n_layers=3,
    d_ff=F,
    positions="rope",
    norm="rms",
    activation="swiglu",
    qkv_bias=False,
    bias=False,
    tie_weights=False,
)
LONG = RopeScaling(
    "longrope",
    factor=8.0,
    original_max_positions=8,
    short_factor=(1.0, 1.5),
    long_factor=(2.0, 7.0),
)
HF_LONG = dict(
    rope_type="longrope",
    rope_theta=100.0,
    partial_rotary_factor=0.5,
    short_factor=list(LONG.short_factor),
    long_factor=list(LONG.long_factor),
    original_max_position_embeddings=8,
)


def _redraw(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter drawn anew (HF starts Gemma's norms at 0 and ours at 1 - offset)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module.eval()


def _config(hf_config: object) -> object:
    hf_config._attn_implementation = "eager"
    return hf_config


def _hf_mask(fn: object, t_q: int, t_k: int) -> torch.Tensor:
    """transformers' mask function evaluated for the last t_q of t_k positions: (t_q, t_k)."""
    zero = torch.tensor(0)
    q = torch.arange(t_k - t_q, t_k)[:, None]
    return fn(zero, zero, q, torch.arange(t_k)[None, :]).expand(t_q, t_k)


# --- the pieces -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_offset_rms_norm_equals_gemmas(dtype):
    theirs = _redraw(g2.Gemma2RMSNorm(D, eps=1e-6)).to(dtype)
    ours = RMSNorm(D, eps=1e-6, offset=1.0).to(dtype)
    ours.weight.data.copy_(theirs.weight.data)
    x = (torch.randn(3, 5, D) * 4).to(dtype)
    diff = (ours(x).float() - theirs(x).float()).abs().max().item()
    assert diff == 0.0  # float32 inside, cast once: the same rounding as Gemma's
    assert torch.equal(RMSNorm(D, offset=1.0)(x), RMSNorm(D)(x))  # a fresh gain is 1 either way


def test_geglu_feed_forward_equals_gemmas_mlp():
    cfg = transformers.Gemma2Config(**SHAPE, hidden_activation="gelu_pytorch_tanh")
    theirs = _redraw(g2.Gemma2MLP(cfg))
    ours = FeedForward(D, F, activation="geglu", bias=False)
    ours.fc.weight.data.copy_(torch.cat([theirs.gate_proj.weight, theirs.up_proj.weight]))
    ours.proj.weight.data.copy_(theirs.down_proj.weight)
    x = torch.randn(2, 5, D)
    assert (ours(x) - theirs(x)).abs().max().item() < 1e-6


@pytest.mark.parametrize("length", [6, 20])  # short factors up to 8 positions, long past them
def test_longrope_partial_tables_and_rotation_equal_phi3s(length):
    cfg = transformers.Phi3Config(
        **SHAPE, original_max_position_embeddings=8, rope_parameters=HF_LONG
    )
    rot = phi3.Phi3RotaryEmbedding(cfg)
    pos = torch.arange(length)[None]
    q, k = torch.randn(2, 1, H, length, HD).unbind(0)
    cos_t, sin_t = rot(q, pos)
    cos, sin = rotary_tables(pos, 4, 100.0, LONG)
    assert (cos - cos_t).abs().max().item() < 1e-6 and (sin - sin_t).abs().max().item() < 1e-6
    assert LONG.magnitude == rot.attention_scaling  # sqrt(1 + ln 8 / ln 8): the default
    q_t, k_t = phi3.apply_rotary_pos_emb(q, k, cos_t, sin_t)
    assert (apply_rotary(q, cos, sin) - q_t).abs().max().item() < 1e-6
    assert torch.equal(apply_rotary(k, cos, sin)[..., 4:], k[..., 4:])  # dims past 4 pass


def test_gemma3_local_and_global_tables_equal_its_rotary_embedding():
    cfg = transformers.Gemma3TextConfig(
        **SHAPE,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
        },
    )
    rot = g3.Gemma3RotaryEmbedding(cfg)
    pos, x = torch.arange(T)[None], torch.randn(1, T, D)
    model = GPT(
        GPTConfig(**LAMINA, sliding_window=4, rope_local_theta=10.0, d_head=HD).replace(
            rope_scaling=RopeScaling("linear", 2.0), rope_theta=1e4
        )
    )
    ours = model.rope_tables(pos)
    for kind, theirs in (("sliding", "sliding_attention"), ("full", "full_attention")):
        cos_t, sin_t = rot(x, pos, theirs)
        assert (ours[kind][0] - cos_t).abs().max().item() < 1e-6
        assert (ours[kind][1] - sin_t).abs().max().item() < 1e-6


@pytest.mark.parametrize("t_q", [1, 3, 9])  # one cached step, a chunk after a cache, a prefill
def test_sliding_window_mask_equals_transformers_mask_function(t_q):
    t_k, w = 9, 4
    fn = masking_utils.sliding_window_causal_mask_function(w)
    theirs = _hf_mask(fn, t_q, t_k)
    ours = attention_mask(t_q, t_k, causal=True, padding_mask=None, device="cpu", window=w)
    assert torch.equal(ours[0, 0], theirs)


def test_gemma2_attention_with_soft_cap_scale_and_window_equals_theirs():
    cfg = _config(
        transformers.Gemma2Config(
            **SHAPE,
            query_pre_attn_scalar=12,
            attn_logit_softcapping=2.0,
            sliding_window=5,
            layer_types=["sliding_attention"] * 3,
        )
    )
    theirs = _redraw(g2.Gemma2Attention(cfg, layer_idx=0))
    ours = MultiHeadAttention(
        D, H, n_kv_heads=HKV, head_dim=HD, causal=True, qkv_bias=False, bias=False,
        rope_theta=cfg.rope_parameters["rope_theta"], sliding_window=5, softcap=2.0,
        scale=12**-0.5,
    )  # fmt: skip
    _copy_attention(ours, theirs)
    x, pos = torch.randn(2, T, D), torch.arange(T)[None]
    rope = g2.Gemma2RotaryEmbedding(cfg)(x, pos)
    fn = masking_utils.sliding_window_causal_mask_function(5)
    allowed = _hf_mask(fn, T, T)
    additive = torch.zeros(T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)
    want, _ = theirs(x, rope, additive[None, None])
    got, _ = ours(x)
    assert (got - want).abs().max().item() < 1e-5
    ours.softcap = None  # without the cap, the window on SDPA equals the written-out softmax
    ours.impl = "reference"
    ref, _ = ours(x)
    ours.impl = "sdpa"
    assert (ours(x)[0] - ref).abs().max().item() < 1e-5


def _copy_attention(ours: MultiHeadAttention, theirs: torch.nn.Module) -> None:
    a = theirs
    qkv = getattr(a, "qkv_proj", None)
    w = (
        qkv.weight
        if qkv is not None
        else torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
    )
    ours.qkv.weight.data.copy_(w)
    ours.proj.weight.data.copy_(a.o_proj.weight)
    if getattr(a, "q_norm", None) is not None and ours.q_gain is not None:
        ours.q_gain.data.copy_(a.q_norm.weight)
        ours.k_gain.data.copy_(a.k_norm.weight)


# --- whole tiny models of each family, a state dict copied by hand ----------------------------


def _state_from_hf(hf: torch.nn.Module, sandwich: bool) -> dict[str, torch.Tensor]:
    """transformers' names -> lamina's (q/k/v and gate/up fused as lamina stores them)."""
    sd, out = hf.state_dict(), {}
    out["embed.wte.weight"], out["norm_f.weight"] = (
        sd["model.embed_tokens.weight"],
        sd["model.norm.weight"],
    )
    out["head.weight"] = sd["lm_head.weight"]
    for i in range(hf.config.num_hidden_layers):
        p, q = f"model.layers.{i}.", f"blocks.{i}."
        a, m = p + "self_attn.", p + "mlp."
        out[q + "attn.qkv.weight"] = sd.get(a + "qkv_proj.weight", None)
        if out[q + "attn.qkv.weight"] is None:
            out[q + "attn.qkv.weight"] = torch.cat([sd[a + n + "_proj.weight"] for n in "qkv"])
        out[q + "attn.proj.weight"] = sd[a + "o_proj.weight"]
        if a + "q_norm.weight" in sd:
            out[q + "attn.q_gain"], out[q + "attn.k_gain"] = (
                sd[a + "q_norm.weight"],
                sd[a + "k_norm.weight"],
            )
        out[q + "ff.fc.weight"] = sd.get(m + "gate_up_proj.weight", None)
        if out[q + "ff.fc.weight"] is None:
            out[q + "ff.fc.weight"] = torch.cat(
                [sd[m + "gate_proj.weight"], sd[m + "up_proj.weight"]]
            )
        out[q + "ff.proj.weight"] = sd[m + "down_proj.weight"]
        out[q + "norm1.weight"] = sd[p + "input_layernorm.weight"]
        if sandwich:
            out[q + "post_attn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
            out[q + "norm2.weight"] = sd[p + "pre_feedforward_layernorm.weight"]
            out[q + "post_ff_norm.weight"] = sd[p + "post_feedforward_layernorm.weight"]
        else:
            out[q + "norm2.weight"] = sd[p + "post_attention_layernorm.weight"]
    return out


GEMMA = dict(
    norm_offset=1.0,
    sandwich_norm=True,
    activation="geglu",
    embed_scale=math.sqrt(D),
    attn_scale=12**-0.5,
    tie_weights=True,
    d_head=HD,
    layer_norm_eps=1e-6,
)


def _families():
    """(name, transformers model, lamina config) for each family, tiny and random."""
    mistral = mis.MistralForCausalLM(_config(transformers.MistralConfig(**SHAPE, sliding_window=5)))
    gemma2 = g2.Gemma2ForCausalLM(
        _config(
            transformers.Gemma2Config(
                **SHAPE,
                query_pre_attn_scalar=12,
                attn_logit_softcapping=2.0,
                final_logit_softcapping=3.0,
                sliding_window=5,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                rms_norm_eps=1e-6,
            )
        )
    )
    gemma3 = g3.Gemma3ForCausalLM(
        _config(
            transformers.Gemma3TextConfig(
                **SHAPE,
                query_pre_attn_scalar=12,
                sliding_window=5,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                rope_parameters={
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                },
            )
        )
    )
    phi = phi3.Phi3ForCausalLM(
        _config(
            transformers.Phi3Config(
                **SHAPE,
                original_max_position_embeddings=8,
                rope_parameters=HF_LONG,
                sliding_window=6,
            )
        )
    )
    return [
        ("mistral", mistral, GPTConfig(**LAMINA, d_head=HD, sliding_window=5, layer_norm_eps=1e-6,
                                        rope_theta=mistral.config.rope_parameters["rope_theta"])),
        ("gemma2", gemma2, GPTConfig(**{**LAMINA, **GEMMA}, sliding_window=5, attn_softcap=2.0,
                                      logit_softcap=3.0, layer_types=("sliding", "full", "sliding"),
                                      rope_theta=gemma2.config.rope_parameters["rope_theta"])),
        ("gemma3", gemma3, GPTConfig(**{**LAMINA, **GEMMA}, sliding_window=5, qk_norm=True,
                                      layer_types=("sliding", "sliding", "full"), rope_theta=1e4,
                                      rope_local_theta=10.0, rope_scaling=RopeScaling("linear", 2.0))),
        ("phi3", phi, GPTConfig(**LAMINA, rotary_dim=4, rope_theta=100.0, rope_scaling=LONG,
                                sliding_window=6)),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def families():
    built = []
    for name, hf, config in _families():
        _redraw(hf, seed=len(built))
        ours = GPT(config).eval()
        ours.load_state_dict(_state_from_hf(hf, config.sandwich_norm), strict=True)
        built.append((name, hf, ours))
    return built


def test_each_family_s_logits_equal_transformers(families):
    g = torch.Generator().manual_seed(1)
    for name, hf, ours in families:
        assert count_params(ours.config) == ours.num_params() == hf.num_parameters(), name
        for length in (6, 20):  # within and past the window (and Phi-3's 8 short positions)
            ids = torch.randint(0, V, (2, length), generator=g)
            with torch.no_grad():
                want = hf(ids).logits
                got = ours(ids)
                ours.set_attention_impl("reference")
                ref = ours(ids)
                ours.set_attention_impl("sdpa")
            assert (got - want).abs().max().item() < 1e-4, (name, length)
            assert (got - ref).abs().max().item() < 1e-5, (name, length)


@torch.no_grad()
def test_each_family_s_cached_decode_equals_a_full_recompute_past_the_window(families):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, V, (2, 20), generator=g)
    for name, _, ours in families:
        # the logits, one token at a time after a 9-token prefill (Phi-3 past its 8 short
        # positions from the start), to 20 tokens: 4 windows of 5
        caches = ours.make_caches(2)
        steps = [ours(ids[:, :9], caches=caches)]
        steps += [ours(ids[:, t : t + 1], caches=caches) for t in range(9, 20)]
        assert (torch.cat(steps, 1) - ours(ids)).abs().max().item() < 1e-5, name
        # generation (left-padded prompts, past block_size's window jumps, and Phi-3 crossing
        # from short to long factors mid-decode): the same tokens as recomputing every step
        prompts = [ids[0, :7].tolist(), ids[1, :4].tolist()]
        assert unsupported(ours) is not None  # the native step refuses, PyTorch runs it
        small = GPT(ours.config.replace(block_size=12)).eval()
        small.load_state_dict(ours.state_dict())
        cached = generate(small, prompts, 14, use_cache=True)
        assert torch.equal(cached, generate(small, prompts, 14, use_cache=False)), name
        assert torch.equal(cached, generate(small, prompts, 14, fixed_shape=True)), name

"""Each Gemma / Phi-3 / Mistral layer option alone through lamina's decode paths: the native
step refuses it by name and PyTorch runs it; the cached, fixed-shape and recomputed paths give
the same tokens, a row of a batch what it gives alone, serve's continuous batch and a
conversation's cache what a fresh forward gives. (Parity with transformers:
tests/test_layer_options.py.)
"""

from __future__ import annotations

import pytest
import torch

from lamina import GPTConfig
from lamina.generation import generate
from lamina.models.gpt import GPT
from lamina.models.params import count_params
from lamina.native.coverage import unsupported
from lamina.native.step import native_step
from lamina.rope import RopeScaling

V = 64
SMALL = dict(vocab_size=V, block_size=12, d_model=32, n_heads=4, n_layers=3, d_ff=48, init_std=0.3)


def tiny(**options: object) -> GPT:
    """llama-tiny's layers (rope, RMSNorm, SwiGLU, 2 KV heads) at a tiny width, with options."""
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("llama-tiny", **{**SMALL, **options})).eval()


# --- each option alone: native refuses it by name, the PyTorch step decodes it ----------------

OPTIONS = {
    "sliding_window": dict(sliding_window=3),
    "rope_local_theta": dict(
        sliding_window=3, layer_types=("sliding", "full", "sliding"), rope_local_theta=50.0
    ),
    "attn_softcap": dict(attn_softcap=0.5),
    "attn_scale": dict(attn_scale=0.9),
    "embed_scale": dict(embed_scale=3.0),
    "norm_offset": dict(norm_offset=1.0),
    "sandwich_norm": dict(sandwich_norm=True),
    "geglu": dict(activation="geglu"),
    "rotary_dim": dict(rotary_dim=4),
    "longrope": dict(rope_scaling=RopeScaling(
        "longrope", 4.0, original_max_positions=6, short_factor=(1.0,) * 4,
        long_factor=(2.0, 3.0, 5.0, 9.0),
    )),
}  # fmt: skip


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_each_option_is_refused_by_native_by_name_and_decodes_as_a_recompute(option):
    model = tiny(**OPTIONS[option])
    assert count_params(model.config) == model.num_params()
    assert option in unsupported(model)
    assert native_step(model, model.make_caches(2)) is None
    prompts = [[1, 2, 3, 4, 5], [6, 7]]
    cached = generate(model, prompts, 16, use_cache=True)
    assert torch.equal(cached, generate(model, prompts, 16, use_cache=False))
    assert torch.equal(cached, generate(model, prompts, 16, fixed_shape=True))
    alone = generate(model, prompts[1:], 16)[0]  # a row computes in a batch what it does alone
    assert torch.equal(cached[1, 3:], alone)


@torch.no_grad()
def test_a_continuous_batch_step_sees_each_row_s_own_window():
    # lamina serve steps rows at different positions through one cache (serve/kv_rows.py):
    # a single query's window ends at its own column, not at the widest row's
    from lamina.serve.kv_rows import prefill_row, torch_step

    model = tiny(block_size=16, sliding_window=3)
    seqs = [torch.randint(0, V, (11,)), torch.randint(0, V, (6,))]
    caches = model.make_caches(2, 16)
    for r, s in enumerate(seqs):  # prefill all but each row's last token
        prefill_row(model, caches, r, 0, s[:-1].tolist())
    got = torch_step(model, caches, [int(s[-1]) for s in seqs], [len(s) - 1 for s in seqs])
    for r, s in enumerate(seqs):
        assert (got[r] - model(s[None])[0, -1]).abs().max().item() < 1e-5


@torch.no_grad()
def test_a_conversation_cache_recomputes_where_longrope_changes_its_factors():
    from lamina.generation.prefix import PrefixCache

    model = tiny(block_size=32, **OPTIONS["longrope"])
    ids = torch.randint(0, V, (14,)).tolist()
    cache = PrefixCache(model, 32)
    got = [cache.prefill(ids[:4])[0]] + [cache.step(t) for t in ids[4:12]]  # crosses 6
    want = [model(torch.tensor([ids[: n + 1]]))[:, -1] for n in range(3, 12)]
    for g, w in zip(got, want, strict=True):
        assert (g - w).abs().max().item() < 1e-4  # keys left short would be ~1e-1 off
    back, reused = cache.prefill(ids[:5])  # cut back under 6 positions: short factors again
    assert reused == 0 and (back - model(torch.tensor([ids[:5]]))[:, -1]).abs().max() < 1e-4

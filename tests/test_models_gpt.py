"""Layer 4: the GPT decoder (seed notebook checks 4-7, plus tying, caches and bad input)."""

import math

import pytest
import torch
import torch.nn.functional as F

from lamina import GPT, GPTConfig, LaminaError
from lamina.models.params import count_module_params


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("tiny", **kw)).eval()


def test_logits_have_shape_batch_time_vocab():
    model = tiny()
    assert model(torch.randint(0, 100, (3, 12))).shape == (3, 12, 100)


def test_last_only_returns_the_last_position():
    model = tiny()
    ids = torch.randint(0, 100, (2, 9))
    torch.testing.assert_close(model(ids, last_only=True), model(ids)[:, -1:])


def test_model_is_causal_end_to_end():
    """Logits at earlier positions do not depend on later tokens."""
    model = tiny()
    ids = torch.randint(0, 100, (2, 12))
    ids2 = ids.clone()
    ids2[:, -1] = (ids2[:, -1] + 1) % 100
    torch.testing.assert_close(model(ids)[:, :-1], model(ids2)[:, :-1])


def test_head_is_tied_by_default_and_counted_once():
    model = tiny()
    assert model.head.weight is model.embed.wte.weight
    untied = tiny(tie_weights=False)
    assert untied.head.weight.data_ptr() != untied.embed.wte.weight.data_ptr()
    assert count_module_params(untied) - count_module_params(model) == 100 * 32


def test_initial_loss_is_about_ln_vocab():
    """An untrained model knows nothing: cross-entropy close to ln(vocab)."""
    model = tiny(vocab_size=1000)
    ids = torch.randint(0, 1000, (4, 32))
    loss = F.cross_entropy(model(ids).flatten(0, 1), torch.randint(0, 1000, (4 * 32,)))
    assert abs(loss.item() - math.log(1000)) < 0.1


def test_greedy_keeps_prompt_is_deterministic_and_crops_past_block_size():
    """43 tokens from a 3-token prompt with block 32: cropping must kick in."""
    model = tiny()
    start = torch.tensor([[1, 2, 3]])
    out = model.greedy(start, 40)
    assert out.shape == (1, 43)
    assert torch.equal(out[:, :3], start)
    assert torch.equal(out, model.greedy(start, 40))
    assert 0 <= out.min() and out.max() < 100


def test_greedy_restores_training_mode():
    model = tiny().train()
    model.greedy(torch.tensor([[1]]), 2)
    assert model.training


def test_cached_forward_equals_full_forward():
    """Prefill then token-by-token decoding with KV caches gives the full-recompute logits."""
    model = tiny()
    ids = torch.randint(0, 100, (2, 20))
    full = model(ids)
    caches = model.make_caches(2)
    steps = [model(ids[:, :8], caches=caches)]
    steps += [model(ids[:, t : t + 1], caches=caches) for t in range(8, 20)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_reference_attention_gives_the_same_logits():
    model = tiny()
    ids = torch.randint(0, 100, (2, 16))
    fast = model(ids)
    model.set_attention_impl("reference")
    assert (model(ids) - fast).abs().max() < 1e-5


def test_attention_weights_are_causal_maps_per_layer():
    maps = tiny().attention_weights(torch.randint(0, 100, (1, 6)))
    assert len(maps) == 2 and maps[0].shape == (1, 4, 6, 6)
    assert torch.triu(maps[1][0, 0], diagonal=1).abs().max() == 0


def test_post_ln_and_sinusoidal_variants_build_and_run():
    model = tiny(norm_first=False, positions="sinusoidal", activation="relu", bias=False)
    assert model(torch.randint(0, 100, (1, 5))).shape == (1, 5, 100)


LLAMA_LIKE = dict(positions="rope", norm="rms", activation="swiglu", n_kv_heads=2, bias=False)


@pytest.mark.parametrize(
    "kw",
    [
        LLAMA_LIKE,
        {**LLAMA_LIKE, "qk_norm": True, "norm_gain": False},
        {"activation": "relu2", "n_kv_heads": 1, "logit_softcap": 2.0},
    ],
)
def test_modern_options_are_causal_cache_exact_and_impl_independent(kw):
    model = tiny(init_std=0.1, **kw)
    ids = torch.randint(0, 100, (2, 12))
    full = model(ids)
    ids2 = ids.clone()
    ids2[:, -1] = (ids2[:, -1] + 1) % 100
    torch.testing.assert_close(model(ids2)[:, :-1], full[:, :-1], atol=1e-5, rtol=0)
    caches = model.make_caches(2)
    assert caches[0].k.shape[1] == model.config.kv_heads
    steps = [model(ids[:, :5], caches=caches)] + [
        model(ids[:, t : t + 1], caches=caches) for t in range(5, 12)
    ]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    model.set_attention_impl("reference")
    torch.testing.assert_close(model(ids), full, atol=1e-5, rtol=0)


def test_rope_model_has_no_position_table_and_still_sees_order():
    model = tiny(init_std=0.1, positions="rope")
    assert model.embed.wpe is None and not hasattr(model.embed, "pe")
    assert model.num_params() == model.num_params(exclude_positions=True)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert (model(ids)[0, -1] - model(ids.flip(1))[0, -1]).abs().max() > 1e-3


def test_logit_softcap_bounds_the_logits():
    model = tiny(init_std=1.0, logit_softcap=2.5)
    logits = model(torch.randint(0, 100, (2, 8)))
    assert logits.abs().max() <= 2.5
    assert logits.abs().max() > 2.0  # large weights: the cap is reached, not avoided


def test_zero_init_proj_starts_residual_projections_at_zero():
    model = tiny(zero_init_proj=True)
    for block in model.blocks:
        assert not block.attn.proj.weight.any() and not block.ff.proj.weight.any()
        assert block.attn.qkv.weight.std() > 0.01


def test_residual_projections_start_smaller():
    """GPT-2 init: residual output projections have std 0.02 / sqrt(2 * n_layers)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", d_model=256, n_heads=4, n_layers=8))
    assert abs(model.blocks[0].attn.proj.weight.std().item() - 0.02 / 4) < 5e-4
    assert abs(model.blocks[0].attn.qkv.weight.std().item() - 0.02) < 5e-4


@pytest.mark.parametrize(
    "ids, message",
    [
        (torch.tensor([[1, 100]]), "outside \\[0, vocab_size=100\\)"),
        (torch.tensor([[0.5, 1.0]]), "integer"),
        (torch.zeros(1, 33, dtype=torch.long), "block_size 32"),
    ],
)
def test_bad_input_raises_value_error(ids, message):
    with pytest.raises(ValueError, match=message):
        tiny()(ids)


def test_greedy_rejects_a_negative_count():
    with pytest.raises(LaminaError, match="max_new_tokens"):
        tiny().greedy(torch.tensor([[1]]), -1)


def test_a_model_with_every_option_saves_and_loads_exactly(tmp_path):
    import lamina

    model = tiny(init_std=0.1, **LLAMA_LIKE, qk_norm=True, logit_softcap=9.0, tie_weights=False)
    lamina.save(tmp_path / "m", model)
    back, _ = lamina.load(tmp_path / "m")
    ids = torch.randint(0, 100, (2, 9))
    assert back.config == model.config
    assert torch.equal(back(ids), model(ids))


def test_an_old_config_without_the_new_fields_means_what_it_meant():
    old = {k: v for k, v in GPTConfig.preset("tiny").to_dict().items() if k != "n_kv_heads"}
    old = {k: v for k, v in old.items() if k not in ("positions", "norm", "rope_theta")}
    c = GPTConfig.from_dict(old)
    assert (c.positions, c.norm, c.kv_heads, c.activation) == ("learned", "layer", 4, "gelu")
    assert c.logit_softcap is None and not c.qk_norm and not c.zero_init_proj

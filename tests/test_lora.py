"""LoRA adapters (lamina.lora): step 0 is the base, q/k/v apart inside the fused projection,
the base frozen, merge exact, adapters alone in the state, int8/int4 bases, sizes by formula."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from lamina import GPT, GPTConfig, LaminaError
from lamina.lora import (
    PRESETS,
    LoRAConfig,
    LoRALinear,
    apply_lora,
    load_lora_state,
    lora_config,
    lora_parameters,
    lora_state_dict,
    merge_lora,
    parse_targets,
)
from lamina.lora_size import count_lora_params, fit_bytes
from lamina.models.params import count_params
from lamina.quant import quantize

# grouped-query heads (4 query, 2 key/value), SwiGLU, rotary, untied head
LLAMA = dict(
    vocab_size=61, block_size=16, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=48,
    positions="rope", norm="rms", activation="swiglu", qkv_bias=False, bias=False,
    tie_weights=False,
)  # fmt: skip
GPT2 = dict(vocab_size=61, block_size=16, d_model=32, n_heads=4, n_layers=2)


def _model(seed: int = 0, **over) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**(LLAMA | over))).eval()


def _ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(seed))


def _randomize_b(model: torch.nn.Module, seed: int = 3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def test_step_zero_equals_the_base_exactly():
    """B starts at zero, so the adapted model's logits are the base's, bit for bit."""
    model, ids = _model(), _ids()
    before = model(ids)
    apply_lora(model, r=4, alpha=8, targets="all")
    assert torch.equal(model(ids), before)
    for m in model.modules():
        if isinstance(m, LoRALinear):
            for a in m.lora_A.values():
                assert a.abs().sum() > 0  # A is random (Kaiming), only B is zero


def test_scaling_is_alpha_over_r_and_config_is_recorded():
    model = apply_lora(_model(), r=4, alpha=10, dropout=0.0, targets="qv")
    cfg = lora_config(model)
    assert cfg == LoRAConfig(r=4, alpha=10, dropout=0.0, targets=("q", "v"))
    assert cfg.scaling == 2.5
    assert LoRAConfig.from_dict(cfg.to_dict()) == cfg
    assert model.blocks[0].attn.qkv.scaling == 2.5


def test_fused_qkv_with_grouped_heads_adapts_q_k_v_separately():
    """Each of q (H hd wide) and k, v (H_kv hd wide) gets its own A, B; only its rows change."""
    model = apply_lora(_model(), r=4, alpha=8, dropout=0.0, targets="q,v")
    qkv = model.blocks[0].attn.qkv
    assert set(qkv.lora_A) == {"q", "v"}
    assert qkv.lora_B["q"].shape == (4 * 8, 4) and qkv.lora_B["v"].shape == (2 * 8, 4)
    _randomize_b(model)
    x = torch.randn(3, 32)
    with torch.no_grad():
        base = qkv.base(x)
        got = qkv(x)
        q, k, v = (got - base).split([32, 16, 16], dim=-1)
        s = qkv.scaling
        want_q = x @ qkv.lora_A["q"].T @ qkv.lora_B["q"].T * s
        want_v = x @ qkv.lora_A["v"].T @ qkv.lora_B["v"].T * s
    torch.testing.assert_close(q, want_q)
    torch.testing.assert_close(v, want_v)
    assert torch.equal(k, torch.zeros_like(k))  # k not targeted: exactly the base


def test_base_is_frozen_and_only_adapters_get_gradients():
    model = apply_lora(_model(), r=4, targets="all")
    _randomize_b(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert {id(p) for p in lora_parameters(model)} == {
        id(p) for p in model.parameters() if p.requires_grad
    }
    model.train()
    logits = model(_ids())
    logits.logsumexp(-1).mean().backward()
    for n, p in model.named_parameters():
        assert (p.grad is not None) == p.requires_grad, n
    assert model.blocks[0].attn.qkv.lora_A["q"].grad.abs().sum() > 0


def test_dropout_only_in_training_mode():
    model = apply_lora(_model(), r=4, dropout=0.5, targets="all")
    _randomize_b(model)
    ids = _ids()
    assert torch.equal(model(ids), model(ids))  # eval: deterministic
    model.train()
    torch.manual_seed(0)
    a = model(ids)
    torch.manual_seed(1)
    assert not torch.allclose(a, model(ids))


@pytest.mark.parametrize("arch", [LLAMA, GPT2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("targets", list(PRESETS))
def test_merge_gives_plain_linears_with_the_same_logits(arch, targets):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**arch)).eval()
    apply_lora(model, r=4, alpha=16, targets=targets)
    _randomize_b(model)
    ids = _ids()
    with torch.no_grad():
        before = model(ids)
        merge_lora(model)
        after = model(ids)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    assert lora_config(model) is None
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert set(model.state_dict()) == set(GPT(GPTConfig(**arch)).state_dict())


def test_untied_head_can_be_adapted_and_a_tied_one_is_refused():
    model = apply_lora(_model(), r=2, targets="head")
    assert isinstance(model.head, LoRALinear)
    with pytest.raises(LaminaError, match="untied head"):
        apply_lora(_model(tie_weights=True), r=2, targets="q,head")


def test_state_dict_holds_only_adapters_and_loads_back():
    model = apply_lora(_model(), r=4, targets="attn")
    _randomize_b(model)
    state = lora_state_dict(model)
    assert state and all(".lora_A." in k or ".lora_B." in k for k in state)
    assert "blocks.1.attn.qkv.lora_A.k" in state and "blocks.1.ff.fc.lora_A.gate" not in state
    assert sum(t.numel() for t in state.values()) == count_lora_params(model.config, model.lora)
    blob = st_save(state)  # safetensors-saveable
    other = apply_lora(_model(), model.lora)
    load_lora_state(other, st_load(blob))
    ids = _ids()
    torch.testing.assert_close(other(ids), model(ids))
    wrong = apply_lora(_model(), r=4, targets="qv")
    with pytest.raises(LaminaError, match="unexpected"):
        load_lora_state(wrong, state)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_qlora_over_a_quantized_base(scheme):
    """The base stays quantized; step 0 is the quantized model; adapters train; merge keeps it
    quantized and close."""
    model = quantize(_model(d_ff=64), scheme, group_size=32)
    ids = _ids()
    with torch.no_grad():
        base = model(ids)
    apply_lora(model, r=4, targets="all")
    with torch.no_grad():
        assert torch.equal(model(ids), base)
    assert type(model.blocks[0].attn.qkv.base).__name__.startswith(scheme.capitalize())
    model.train()
    opt = torch.optim.AdamW(lora_parameters(model), lr=1e-2)
    loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    loss.backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        trained = model(ids)
        assert not torch.allclose(trained, base)
        merge_lora(model)
        merged = model(ids)
    assert type(model.blocks[0].attn.qkv).__name__.startswith(scheme.capitalize())
    assert (merged - trained).abs().max() < 0.1 * (trained - base).abs().max() + 0.05


def test_count_by_formula_equals_the_built_adapters():
    for arch in (LLAMA, GPT2):
        for targets in [*PRESETS, "q,down"] + (["all,head"] if arch is LLAMA else []):
            torch.manual_seed(0)
            model = apply_lora(GPT(GPTConfig(**arch)), r=3, targets=targets)
            built = sum(p.numel() for p in lora_parameters(model))
            assert count_lora_params(model.config, model.lora) == built, (arch, targets)


def test_memory_fit_counts_lora_as_lora():
    config = GPTConfig.preset("smollm-135m")
    n = count_params(config)
    lora = LoRAConfig()
    assert fit_bytes(config) == 16 * n
    assert fit_bytes(config, lora) == 4 * n + 16 * count_lora_params(config, lora)
    assert fit_bytes(config, lora) < 0.3 * fit_bytes(config)
    assert count_lora_params(config, lora) < 0.05 * n


def test_bad_settings_are_one_clear_line():
    with pytest.raises(LaminaError, match="unknown LoRA target 'qq'"):
        parse_targets("q,qq")
    with pytest.raises(LaminaError, match="lora r"):
        LoRAConfig(r=0)
    with pytest.raises(LaminaError, match="lora dropout"):
        LoRAConfig(dropout=1.0)
    with pytest.raises(LaminaError, match="no linear"):
        apply_lora(GPT(GPTConfig(**GPT2)), targets="gate")
    model = apply_lora(_model(), r=2)
    with pytest.raises(LaminaError, match="already has LoRA"):
        apply_lora(model, r=2)
    with pytest.raises(LaminaError, match="no LoRA adapters"):
        merge_lora(_model())

"""--activation-checkpointing: the same gradients (dropout included), the same state keys,
and eval / no_grad untouched."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lamina import GPT, GPTConfig, LaminaError
from lamina.lora import apply_lora, lora_parameters
from lamina.training.config import TrainConfig
from lamina.training.recompute import checkpoint_blocks


def _grads(recompute: bool, lora: bool) -> tuple[list[torch.Tensor], list[str]]:
    torch.manual_seed(0)
    cfg = GPTConfig.preset("llama-tiny", vocab_size=50, d_model=32, n_layers=3, d_ff=64,
                           block_size=24, dropout=0.1)  # fmt: skip
    model = GPT(cfg)
    if lora:
        apply_lora(model, r=4, alpha=8, dropout=0.1, targets="all")
        for p in lora_parameters(model):
            torch.nn.init.normal_(p, std=0.05)
    if recompute:
        checkpoint_blocks(model)
    keys = list(model.state_dict())
    model.train()
    ids = torch.randint(0, 50, (3, 25), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)  # the dropout masks: drawn again, alike, in the recomputation
    F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
    params = lora_parameters(model) if lora else list(model.parameters())
    return [p.grad for p in params], keys


def test_recomputed_blocks_give_the_same_gradients():
    for lora in (False, True):
        (want, keys), (got, keys2) = _grads(False, lora), _grads(True, lora)
        assert keys == keys2  # checkpoints and adapters do not see it
        for a, b in zip(want, got, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_option_is_a_checked_flag_a_resume_may_change():
    from lamina.training.session import RESUMABLE

    assert "activation_checkpointing" in RESUMABLE
    assert TrainConfig(activation_checkpointing=True).activation_checkpointing
    with pytest.raises(LaminaError, match="activation_checkpointing"):
        TrainConfig(activation_checkpointing="yes")

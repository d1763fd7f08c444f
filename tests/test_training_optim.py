"""AdamW groups, gradient accumulation and the optimizer's pickle-free state."""

from __future__ import annotations

import numpy as np
import torch

from lamina import GPT, GPTConfig
from lamina.training.lm import LMObjective
from lamina.training.loop import train_step
from lamina.training.optim import (
    build_optimizer,
    load_optimizer_tensors,
    optimizer_tensors,
    param_groups,
)


def tiny_model(seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig.preset("tiny", vocab_size=20, block_size=16, **kw))


def test_decay_only_on_matrices_and_tied_weight_once():
    """>= 2-D weights decay, 1-D do not; the tied token table / head appears exactly once."""
    model = tiny_model()
    decay, no_decay = param_groups(model, 0.1)
    ids = [id(p) for g in (decay, no_decay) for p in g["params"]]
    assert len(ids) == len(set(ids))
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == model.num_params()
    assert all(p.dim() >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.dim() < 2 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0
    assert model.head.weight is model.embed.wte.weight
    assert sum(p is model.head.weight for p in decay["params"]) == 1


def _grads_after(accum: int) -> tuple[float, dict[str, torch.Tensor]]:
    model = tiny_model()
    tokens = np.random.default_rng(0).integers(0, 20, 2000).astype(np.uint8)
    task = LMObjective(tokens[:1800], tokens[1800:], 16, seed=3)
    batch = task.draw(8)
    opt = build_optimizer(model, lr=0.0)  # lr 0: the step leaves weights alone
    grads = {}

    def keep(*_a, **_k):
        for n, p in model.named_parameters():
            grads[n] = p.grad.clone()

    opt.register_step_pre_hook(keep)
    loss = train_step(model, task, opt, batch, accum=accum)
    return loss, grads


def test_accumulation_equals_one_big_batch():
    """Batch 8 as 1 x 8 or as 4 micro-batches of 2: same loss, same gradients."""
    loss1, g1 = _grads_after(1)
    loss4, g4 = _grads_after(4)
    assert abs(loss1 - loss4) < 1e-6
    for name in g1:
        torch.testing.assert_close(g1[name], g4[name], rtol=1e-5, atol=1e-6)


def test_optimizer_state_round_trips_without_pickle():
    model = tiny_model()
    opt = build_optimizer(model, lr=1e-2)
    model(torch.randint(0, 20, (2, 8))).sum().backward()
    opt.step()
    tensors, meta = optimizer_tensors(opt)
    assert all(isinstance(v, torch.Tensor) for v in tensors.values())
    model2 = tiny_model(seed=1)
    opt2 = build_optimizer(model2, lr=5.0)
    load_optimizer_tensors(opt2, tensors, meta)
    for a, b in zip(opt.param_groups, opt2.param_groups, strict=True):
        assert a["lr"] == b["lr"] and a["weight_decay"] == b["weight_decay"]
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        torch.testing.assert_close(opt.state[p]["exp_avg"], opt2.state[q]["exp_avg"])

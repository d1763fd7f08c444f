"""Muon + AdamW in one optimizer: the iteration, the AdamW half, resumable state, bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from lamina import LaminaError
from lamina.training.muon import MuonAdamW, orthogonalize


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (32, 32)])
def test_newton_schulz_brings_singular_values_near_one(shape):
    torch.manual_seed(0)
    for g, steps in (
        (torch.randn(*shape), 5),  # a gradient-like matrix: Muon's default 5 steps
        (torch.randn(*shape) * torch.logspace(-2, 1, shape[1]), 10),  # condition number ~1e3
    ):
        s = torch.linalg.svdvals(orthogonalize(g, steps))
        assert s.shape[0] == min(shape)
        # the quintic is tuned for speed, not convergence: it lands in a band around 1
        assert 0.6 < float(s.min()) and float(s.max()) < 1.25, (steps, s.min(), s.max())


def test_a_stack_is_orthogonalized_matrix_by_matrix():
    torch.manual_seed(0)
    g = torch.randn(3, 48, 16)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        each = torch.stack([orthogonalize(m, 5, dtype) for m in g])
        torch.testing.assert_close(orthogonalize(g, 5, dtype), each, atol=tol, rtol=tol)


def _pair():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    return m, copy.deepcopy(m)


def _groups(m, kind_for_matrices):
    mats = [p for p in m.parameters() if p.dim() == 2]
    rest = [p for p in m.parameters() if p.dim() < 2]
    return [{"params": mats, "kind": kind_for_matrices}, {"params": rest, "kind": "adamw"}]


def _steps(m, opt, n=5):
    torch.manual_seed(1)
    for _ in range(n):
        x = torch.randn(32, 8)
        loss = m(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_the_adamw_half_equals_torch_adamw():
    a, b = _pair()
    ref = torch.optim.AdamW(a.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99))
    ours = MuonAdamW(
        _groups(b, "adamw") + [{"params": [nn.Parameter(torch.zeros(2, 2))], "kind": "muon"}],
        lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99),
    )  # fmt: skip
    _steps(a, ref)
    _steps(b, ours)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_muon_lowers_the_loss_and_resumes_exactly():
    a, _ = _pair()
    opt = MuonAdamW(_groups(a, "muon"), lr=2e-2, weight_decay=0.01)
    torch.manual_seed(1)
    x = torch.randn(32, 8)
    before = a(x).pow(2).mean().item()
    _steps(a, opt, 3)
    assert a(x).pow(2).mean().item() < before
    b = copy.deepcopy(a)
    opt_b = MuonAdamW(_groups(b, "muon"), lr=2e-2, weight_decay=0.01)
    opt_b.load_state_dict(copy.deepcopy(opt.state_dict()))
    _steps(a, opt, 3)
    _steps(b, opt_b, 3)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_bad_groups_are_refused():
    m, _ = _pair()
    with pytest.raises(LaminaError, match="2-D matrices only"):
        MuonAdamW([{"params": list(m.parameters()), "kind": "muon"}])
    with pytest.raises(LaminaError, match="no 2-D weight matrix|has none"):
        MuonAdamW([{"params": list(m.parameters()), "kind": "adamw"}])
    with pytest.raises(LaminaError, match="kind 'muon' or 'adamw'"):
        MuonAdamW([{"params": list(m.parameters())}])

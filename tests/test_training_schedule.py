"""Learning-rate schedule shape and the wall-clock budget planner."""

from __future__ import annotations

import pytest

from lamina.errors import LaminaError
from lamina.training.config import TrainConfig
from lamina.training.schedule import TimeBudget, lr_at, parse_duration


def test_warmup_rises_linearly_then_peaks():
    """Warmup is linear from peak/(w+1), never zero, and the first decay step is the peak."""
    lrs = [lr_at(s, 100, 1.0, warmup=10) for s in range(11)]
    assert lrs[0] == pytest.approx(1 / 11)
    assert all(b > a for a, b in zip(lrs[:10], lrs[1:11], strict=True))
    assert lrs[10] == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_decay_is_monotone_and_ends_at_the_floor(kind):
    """After warmup the rate only falls, and the last step is exactly the floor."""
    lrs = [lr_at(s, 50, 3e-3, warmup=5, floor_ratio=0.1, kind=kind) for s in range(5, 50)]
    assert all(b <= a for a, b in zip(lrs, lrs[1:], strict=False))
    assert lrs[-1] == pytest.approx(3e-4)
    assert lr_at(80, 50, 3e-3, warmup=5, floor_ratio=0.1, kind=kind) == pytest.approx(3e-4)


def test_cosine_midpoint_is_halfway():
    assert lr_at(50, 101, 1.0, warmup=0, floor_ratio=0.0) == pytest.approx(0.5)


def test_unknown_decay_is_rejected():
    with pytest.raises(LaminaError, match="decay"):
        lr_at(0, 10, 1.0, kind="step")


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("5m", 300), ("1.5h", 5400), ("90", 90), (" 2M ", 120)]
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "5 minutes", "-3s", "0s", "1d"])
def test_parse_duration_rejects(text):
    with pytest.raises(LaminaError):
        parse_duration(text)


def test_time_budget_lays_the_schedule_over_the_budget():
    """With a simulated clock (0.1 s per step, 1 s final reserve), a 10 s budget runs ~90 steps
    and the last step gets the floor learning rate."""
    now = [0.0]
    budget = TimeBudget(10.0)
    budget.begin(now[0])
    budget.set_reserve(1.0)
    step, lrs, done = 0, [], 0
    while True:
        total = budget.plan(done, step, now[0])
        if step >= total:
            break
        lrs.append(lr_at(step, total, 1.0, warmup=5, floor_ratio=0.1))
        now[0] += 0.3 if step == 0 else 0.1  # a slow first step (compilation)
        step += 1
        done += 1
        budget.observe(done, now[0])
    assert 85 <= step <= 90
    assert now[0] <= 9.0 + 1e-9
    assert lrs[-1] == pytest.approx(0.1)


def test_accumulation_must_divide():
    with pytest.raises(LaminaError, match="divisible"):
        TrainConfig(batch_size=12, micro_batch_size=5)
    assert TrainConfig(batch_size=12, micro_batch_size=3).accumulation() == 4
    assert TrainConfig(batch_size=12, micro_batch_size=3).accumulation(world_size=2) == 2

"""The loop over a run directory: exact resume, non-finite loss, atomic checkpoints, budgets.

The run directory's own rules (staging, recovery, metrics) are in test_training_run_dir.py."""

from __future__ import annotations

import json
import time

import pytest
import torch

import lamina
from lamina.errors import LaminaError
from lamina.training.config import TrainConfig
from lamina.training.loop import NonFiniteLoss, run_training
from lamina.training.run_dir import STAGE
from lamina.training.session import new_session, resume_session


def cfg(corpus, **kw) -> TrainConfig:
    base = dict(data=corpus, preset="tiny", batch_size=4, max_steps=12, eval_every=4,
                checkpoint_every=4, eval_batches=2, log_every=1, warmup=2, lr=3e-3,
                model_overrides={"dropout": 0.1, "block_size": 16})  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize(
    ("optimizer", "decay"),
    [("adamw", "cosine"), ("adamw", "wsd"), ("muon", "cosine"), ("muon", "wsd")],
)
def test_resume_continues_exactly(corpus, tmp_path, optimizer, decay):
    """Stopped at a checkpoint and resumed == uninterrupted: per-step losses within 1e-6."""
    kw = dict(optimizer=optimizer, decay=decay, embed_lr_scale=0.5)
    full = run_training(new_session(cfg(corpus, **kw), out=tmp_path / "a"), quiet=True)
    part = run_training(new_session(cfg(corpus, **kw), out=tmp_path / "b"), quiet=True, stop_at=8)
    assert part.stopped == "interrupted" and part.step == 8
    rest = run_training(resume_session(tmp_path / "b", {}), quiet=True)
    assert sorted(rest.losses) == list(range(9, 13))
    for step in range(1, 13):
        got = part.losses.get(step, rest.losses.get(step))
        assert abs(got - full.losses[step]) <= 1e-6, step
    logged = [
        r["loss"] for r in map(json.loads, open(tmp_path / "b" / "metrics.jsonl")) if "loss" in r
    ]
    assert logged == pytest.approx([full.losses[s] for s in range(1, 13)], abs=1e-6)


def test_run_dir_loads_with_lamina_load(corpus, tmp_path):
    run_training(new_session(cfg(corpus, max_steps=4), out=tmp_path / "r"), quiet=True)
    model, tok = lamina.load(tmp_path / "r")
    assert tok.decode(tok.encode("Speak")) == "Speak"
    assert model(torch.tensor([tok.encode("Speak")])).shape[-1] == tok.vocab_size
    for name in ("train_config.json", "trainer_state.json", "optimizer.safetensors", "loss.png"):
        assert (tmp_path / "r" / name).is_file()
    state = json.loads((tmp_path / "r" / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["tokens_seen"] == 4 * 4 * 16


def test_non_finite_loss_stops_and_keeps_last_checkpoint(corpus, tmp_path, monkeypatch):
    session = new_session(cfg(corpus), out=tmp_path / "r")
    real = session.objective.loss
    calls = {"n": 0}

    def loss(model, batch):
        calls["n"] += model.training  # count training steps, not evaluation batches
        out = real(model, batch)
        return out * float("nan") if calls["n"] == 6 else out

    monkeypatch.setattr(session.objective, "loss", loss)
    with pytest.raises(NonFiniteLoss, match="step 6.*checkpoint: step 4"):
        run_training(session, quiet=True)
    before = json.loads((tmp_path / "r" / "trainer_state.json").read_text())
    assert before["step"] == 4
    model, _ = lamina.load(tmp_path / "r")
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_failed_checkpoint_write_leaves_previous_intact(corpus, tmp_path, monkeypatch):
    """A write error (e.g. a full disk) mid-checkpoint: clear error, old checkpoint intact."""
    session = new_session(cfg(corpus), out=tmp_path / "r")
    run_training(session, quiet=True, stop_at=4)
    good = (tmp_path / "r" / "model.safetensors").read_bytes()
    import lamina.training.run_dir as rd

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rd, "save_tensors", full_disk)
    with pytest.raises(LaminaError, match="No space left on device.*intact"):
        run_training(session, quiet=True, stop_at=8)
    assert (tmp_path / "r" / "model.safetensors").read_bytes() == good
    assert json.loads((tmp_path / "r" / "trainer_state.json").read_text())["step"] == 4
    assert not (tmp_path / "r" / STAGE).exists()


def test_max_time_ends_decayed_within_budget(corpus, tmp_path):
    """A 4-second budget: stops by the deadline (eval and save included), last lr = floor."""
    c = cfg(corpus, max_steps=None, max_time=4.0, eval_every=None, checkpoint_every=None,
            log_every=1, warmup=5, model_overrides={"block_size": 16})  # fmt: skip
    session = new_session(c, out=tmp_path / "r")
    t0 = time.perf_counter()
    result = run_training(session, quiet=True, started_at=t0)
    elapsed = time.perf_counter() - t0
    assert result.stopped == "time" and result.step > 10
    assert elapsed < 4.0 + 1.0  # the issue allows 10% or 10 s; 1 s holds on a loaded machine
    last = [r for r in session.state.metrics if "lr" in r][-1]
    assert last["step"] == result.step
    assert last["lr"] == pytest.approx(c.lr * session.cfg.min_lr_ratio, rel=1e-6)


def test_first_last_task_trains_the_classifier(tmp_path):
    """`--task first-last` runs through the same loop and learns the task."""
    c = TrainConfig(task="first-last", max_steps=300, eval_batches=4)
    session = new_session(c, out=tmp_path / "fl")
    result = run_training(session, quiet=True)
    assert result.eval["accuracy"] >= 0.95
    assert (tmp_path / "fl" / "model.safetensors").is_file()

"""A session, fresh or resumed, and its one save path (session.save_checkpoint)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from lamina.checkpoint import load_tensors
from lamina.errors import LaminaError
from lamina.training.config import DEFAULTS, TrainConfig
from lamina.training.session import (
    Placement,
    new_session,
    resume_session,
    save_checkpoint,
    writer,
)


def tiny(corpus: str, **kw) -> TrainConfig:
    base = dict(data=corpus, preset="tiny", batch_size=4, max_steps=4, eval_batches=2,
                device="cpu", model_overrides={"block_size": 16})  # fmt: skip
    return TrainConfig(**{**base, **kw})


def test_a_session_without_a_run_dir_writes_nothing(corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = new_session(tiny(corpus), out=None)
    assert s.run is None and not writer(s, Placement.alone(s)) and s.cfg.out is None
    assert s.cfg.lr == DEFAULTS["lr"].cpu and s.cfg.seed == 1337  # defaults resolved
    save_checkpoint(s)
    assert list(tmp_path.iterdir()) == []


def test_save_then_resume_restores_step_rng_and_data_position(corpus, tmp_path):
    s = new_session(tiny(corpus), out=tmp_path / "r", command=["lamina", "train"])
    s.objective.draw(4)  # move the sampler on
    s.state.step, s.state.tokens, s.state.seconds_used = 3, 192, 1.5
    save_checkpoint(s, seconds_used=2.5)
    next_batch, next_rand = s.objective.draw(4), torch.rand(3)
    back = resume_session(tmp_path / "r", {})
    assert (back.state.step, back.state.tokens, back.state.seconds_used) == (3, 192, 2.5)
    torch.testing.assert_close(back.objective.draw(4)[0], next_batch[0])
    torch.testing.assert_close(torch.rand(3), next_rand)
    for p, q in zip(s.model.parameters(), back.model.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    saved = json.loads((tmp_path / "r" / "train_config.json").read_text())
    assert saved["command"] == ["lamina", "train"] and saved["train"]["out"] == str(tmp_path / "r")


def test_only_rank_0_writes_and_a_gathered_state_is_what_is_saved(corpus, tmp_path):
    s = new_session(tiny(corpus), out=tmp_path / "r")
    save_checkpoint(s, Placement(s.model, s.opt, rank=1, world_size=2))
    assert not (tmp_path / "r" / "trainer_state.json").exists()
    full = copy.deepcopy(s.model)
    torch.nn.init.zeros_(full.embed.wte.weight)
    calls = []
    gather = lambda: calls.append(1) or (full, s.opt)  # noqa: E731
    save_checkpoint(s, Placement(s.model, s.opt, world_size=2, gather=gather))
    saved = load_tensors(tmp_path / "r" / "model.safetensors")
    assert calls == [1] and saved["embed.wte.weight"].abs().sum() == 0
    keeps_nothing = lambda: calls.append(2)  # noqa: E731 - a rank in the gather that keeps nothing
    (tmp_path / "r" / "trainer_state.json").unlink()
    save_checkpoint(s, Placement(s.model, s.opt, world_size=2, gather=keeps_nothing))
    assert calls == [1, 2] and not (tmp_path / "r" / "trainer_state.json").exists()


def test_resume_names_conflicting_flags_and_accepts_resumable_ones(corpus, tmp_path):
    s = new_session(tiny(corpus), out=tmp_path / "r")
    save_checkpoint(s)
    with pytest.raises(LaminaError, match=r"lr \(run: 0.01, given: 0.1\).*n_layers"):
        resume_session(tmp_path / "r", {"lr": 0.1, "model_overrides": {"n_layers": 9}})
    assert resume_session(tmp_path / "r", {"max_steps": 50}).cfg.max_steps == 50


def test_resume_refuses_changed_data_and_a_damaged_state(corpus, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text(open(corpus).read() + "Speak.\n")
    s = new_session(tiny(str(other)), out=tmp_path / "r")
    save_checkpoint(s)
    other.write_text(open(corpus).read() + "speak.\n")
    with pytest.raises(LaminaError, match="training data differs"):
        resume_session(tmp_path / "r", {})
    other.write_text(open(corpus).read() + "Speak.\n")
    state = json.loads((tmp_path / "r" / "trainer_state.json").read_text())
    del state["torch_rng"]
    (tmp_path / "r" / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(LaminaError, match="damaged"):
        resume_session(tmp_path / "r", {})


def test_a_run_recorded_with_the_old_flat_config_resumes(corpus, tmp_path):
    """Before the task registry, train_config.json held every task's fields side by side."""
    s = new_session(tiny(corpus), out=tmp_path / "r")
    save_checkpoint(s)
    s.run.release()
    path = tmp_path / "r" / "train_config.json"
    saved = json.loads(path.read_text())
    flat = {k: v for k, v in saved["train"].items() if k != "options"}
    flat |= {"val_data": None, "text_column": "text", "label_column": "label", "max_len": 256,
             "pooling": "mean", "class_weights": "none", "bucket": False}  # fmt: skip
    path.write_text(json.dumps({**saved, "train": flat}))
    back = resume_session(tmp_path / "r", {"max_steps": 9})
    back.run.release()
    assert back.cfg == s.cfg.replace(max_steps=9)

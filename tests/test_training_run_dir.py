"""The run directory: creating, opening, staged checkpoints, metrics."""

from __future__ import annotations

import json

import pytest
import torch

from lamina.errors import LaminaError
from lamina.training.run_dir import PREVIOUS, STAGE, RunDir


def test_create_refuses_other_files_and_force_replaces_only_a_run(tmp_path):
    """Files lamina did not write are never touched, --force or not; a run replaced with
    --force waits in .previous-run until the new run's first checkpoint, and comes back if
    the new run ends before it."""
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "notes.txt").write_text("mine")
    for force in (False, True):
        with pytest.raises(LaminaError, match="did not write"):
            RunDir.create(tmp_path / "r", force=force)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [".lock", "notes.txt"]
    RunDir.create(tmp_path / "s").write_train_config({"train": {}})
    (tmp_path / "s" / "trainer_state.json").write_text('{"step": 3}')
    with pytest.raises(LaminaError, match="already holds a training run"):
        RunDir.create(tmp_path / "s")
    run = RunDir.create(tmp_path / "s", force=True)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [".lamina", ".lock", PREVIOUS]
    run.release()  # no checkpoint written: the old run is back
    assert (tmp_path / "s" / "trainer_state.json").read_text() == '{"step": 3}'
    (tmp_path / "f").write_text("x")
    with pytest.raises(LaminaError, match="not a folder"):
        RunDir.create(tmp_path / "f")


def test_open_says_what_is_missing(tmp_path):
    with pytest.raises(LaminaError, match="no such folder"):
        RunDir.open(tmp_path / "nope")
    (tmp_path / "r").mkdir()
    with pytest.raises(LaminaError, match="not a lamina run"):
        RunDir.open(tmp_path / "r")
    RunDir.create(tmp_path / "r", force=True).write_train_config({"train": {}})
    with pytest.raises(LaminaError, match="before its first checkpoint"):
        RunDir.open(tmp_path / "r")


def test_checkpoint_files_round_trip(tmp_path):
    run = RunDir.create(tmp_path / "r")
    tensors = {"state.0.exp_avg": torch.arange(4.0)}
    run.write_checkpoint(
        lambda d: (d / "model.safetensors").write_bytes(b"m"), (tensors, {"x": 1}), {"step": 7}
    )
    state, got, meta = run.read_checkpoint()
    assert state == {"step": 7} and meta == {"x": 1}
    torch.testing.assert_close(got["state.0.exp_avg"], tensors["state.0.exp_avg"])
    assert (tmp_path / "r" / "model.safetensors").read_bytes() == b"m"
    assert not (tmp_path / "r" / STAGE).exists()


def test_metrics_skip_damaged_lines_and_stop_at_a_step(tmp_path):
    run = RunDir.create(tmp_path / "r")
    assert run.read_metrics() == []
    run.write_metrics([{"step": 1, "loss": 2.0}, {"step": 5, "loss": 1.0}])
    with open(tmp_path / "r" / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "lo')  # a line cut short by a crash
    assert [r["step"] for r in run.read_metrics()] == [1, 5]
    assert [r["step"] for r in run.read_metrics(up_to_step=4)] == [1]


def test_staged_checkpoint_is_rolled_forward_or_dropped(tmp_path):
    """A crash after READY finishes the move on open; before READY, the stage is discarded."""
    run = RunDir.create(tmp_path / "r")
    run.write_train_config({"train": {}})
    (tmp_path / "r" / "trainer_state.json").write_text('{"step": 1}')
    stage = tmp_path / "r" / STAGE
    stage.mkdir()
    (stage / "trainer_state.json").write_text('{"step": 2}')
    RunDir.open(tmp_path / "r")
    assert json.loads((tmp_path / "r" / "trainer_state.json").read_text())["step"] == 1
    stage.mkdir()
    (stage / "trainer_state.json").write_text('{"step": 2}')
    (stage / "READY").write_text("ok")
    RunDir.open(tmp_path / "r")
    assert json.loads((tmp_path / "r" / "trainer_state.json").read_text())["step"] == 2
    assert not stage.exists()

"""`lamina train` and `lamina eval` from the command line: bad input, Ctrl-C, kill -9, eval."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lamina.cli import main
from lamina.training.loop import run_training
from lamina.training.session import resume_session

TINY = ["--preset", "tiny", "--block-size", "16", "--batch-size", "4", "--eval-batches", "2"]


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI, expect exit 2 and exactly one line on stderr (no traceback)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_train_then_eval(corpus, tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--data", corpus, *TINY, "--max-steps", "6", "--out", out]) == 0
    assert "validation loss" in capsys.readouterr().out
    assert main(["eval", out, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert set(got) >= {"loss", "perplexity", "bits_per_char", "tokens"}
    assert got["perplexity"] == pytest.approx(2.718281828 ** got["loss"], rel=1e-6)
    assert main(["eval", out, "--data", corpus]) == 0
    assert "bits/char" in capsys.readouterr().out
    cfg = json.loads(Path(out, "train_config.json").read_text())
    assert cfg["train"]["max_steps"] == 6 and cfg["command"][:2] == ["lamina", "train"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--data", "/no/such/file.txt"], "no such file"),
        (["--data", "EMPTY"], "empty"),
        (["--data", "BINARY"], "binary"),
        (["--data", "SHORT"], "block_size"),
        (["--max-time", "soon"], "duration"),
        (["--batch-size", "6", "--micro-batch-size", "4"], "divisible"),
        (["--resume", "NOTARUN"], "not a lamina run"),
        (["--out", "OTHER"], "--force"),
        (["--lr", "-1"], "lr"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle, corpus, tmp_path, capsys):
    files = {"EMPTY": b"", "BINARY": b"abc\x00def" * 10, "SHORT": b"too short"}
    (tmp_path / "NOTARUN").mkdir()
    (tmp_path / "OTHER").mkdir()
    (tmp_path / "OTHER" / "notes.txt").write_text("mine")
    for name, blob in files.items():
        (tmp_path / name).write_bytes(blob)
    args = [str(tmp_path / a) if a in (*files, "NOTARUN", "OTHER") else a for a in args]
    data = [] if "--data" in args or "--resume" in args else ["--data", corpus]
    out = [] if "--out" in args or "--resume" in args else ["--out", str(tmp_path / "r")]
    err = one_line_error(capsys, ["train", *TINY, "--max-steps", "2", *data, *out, *args])
    assert needle in err
    assert (tmp_path / "OTHER" / "notes.txt").read_text() == "mine"


def test_resume_with_conflicting_flags_names_them(corpus, tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--data", corpus, *TINY, "--max-steps", "2", "--out", out]) == 0
    capsys.readouterr()
    err = one_line_error(capsys, ["train", "--resume", out, "--lr", "0.5", "--n-layers", "3"])
    assert "lr" in err and "n_layers" in err
    err = one_line_error(capsys, ["train", "--data", corpus, *TINY, "--out", out])
    assert "--resume" in err and "--force" in err
    assert (
        main(["train", "--data", corpus, *TINY, "--max-steps", "2", "--out", out, "--force"]) == 0
    )


def test_unwritable_out_is_a_clear_error(corpus, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    err = one_line_error(capsys, ["train", "--data", corpus, *TINY, "--out", str(blocker / "r")])
    assert "cannot write" in err or "not a folder" in err


def _spawn(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "lamina", "train", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _wait_for_checkpoint(run: Path, proc: subprocess.Popen, min_step: int) -> int:
    deadline = time.time() + 120
    while time.time() < deadline:
        state = run / "trainer_state.json"
        if state.is_file():
            step = json.loads(state.read_text())["step"]
            if step >= min_step:
                return step
        if proc.poll() is not None:
            pytest.fail(f"trainer exited early: {proc.stderr.read()}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail("no checkpoint within 120 s")


def test_ctrl_c_saves_and_says_how_to_resume(corpus, tmp_path):
    run = tmp_path / "run"
    proc = _spawn(["--data", corpus, *TINY, "--max-steps", "100000", "--checkpoint-every", "5",
                   "--eval-every", "1000", "--out", str(run), "--quiet"])  # fmt: skip
    _wait_for_checkpoint(run, proc, 5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert f"lamina train --resume {run}" in err
    saved = json.loads((run / "trainer_state.json").read_text())["step"]
    assert saved >= 5
    session = resume_session(run, {"max_steps": saved + 2})
    assert run_training(session, quiet=True).step == saved + 2


def test_kill_9_loses_only_steps_since_last_checkpoint(corpus, tmp_path):
    run = tmp_path / "run"
    proc = _spawn(["--data", corpus, *TINY, "--max-steps", "100000", "--checkpoint-every", "3",
                   "--eval-every", "1000", "--out", str(run), "--quiet"])  # fmt: skip
    _wait_for_checkpoint(run, proc, 6)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    session = resume_session(run, {"max_steps": 10**6})
    assert session.state.step >= 6 and session.state.step % 3 == 0
    start = session.state.step
    assert run_training(session, quiet=True, stop_at=start + 2).step == start + 2
